import { A2ABusError, ClosedError, Codes } from "./errors.js";

/** What Queue.get returns when its wait timed out. */
export const TIMEOUT: unique symbol = Symbol("timeout");
/** What Queue.get returns once the queue has ended and is empty. */
export const END: unique symbol = Symbol("end");

type Waiter<T> = (v: T | typeof TIMEOUT | typeof END) => void;

/**
 * A bounded FIFO with async getters. Past `limit` items, put drops the
 * item and counts it in `dropped` (a reader that fell behind learns it
 * and replays), so a stalled reader cannot grow memory without bound.
 */
export class Queue<T> {
  private items: T[] = [];
  private head = 0;
  private waiters: Waiter<T>[] = [];
  private ended = false;
  dropped = 0;

  constructor(private readonly limit = Infinity) {}

  get length(): number {
    return this.items.length - this.head;
  }

  get done(): boolean {
    return this.ended;
  }

  put(item: T): boolean {
    if (this.ended) return false;
    const w = this.waiters.shift();
    if (w) {
      w(item);
      return true;
    }
    if (this.length >= this.limit) {
      this.dropped++;
      return false;
    }
    this.items.push(item);
    return true;
  }

  /** Ends the queue: getters get what is left, then END. */
  end(): void {
    if (this.ended) return;
    this.ended = true;
    for (const w of this.waiters.splice(0)) w(END);
  }

  /** The next item, END, or TIMEOUT after timeoutMs; rejects when signal aborts. */
  get(signal?: AbortSignal, timeoutMs?: number): Promise<T | typeof TIMEOUT | typeof END> {
    if (this.length > 0) {
      const v = this.items[this.head];
      this.items[this.head++] = undefined as T;
      if (this.head > 1024 && this.head * 2 > this.items.length) {
        this.items = this.items.slice(this.head);
        this.head = 0;
      }
      return Promise.resolve(v);
    }
    if (this.ended) return Promise.resolve(END);
    signal?.throwIfAborted();
    return new Promise((resolve, reject) => {
      let timer: Timer | undefined;
      const done: Waiter<T> = (v) => {
        if (timer) clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        resolve(v);
      };
      const drop = () => {
        const i = this.waiters.indexOf(done);
        if (i >= 0) this.waiters.splice(i, 1);
      };
      const onAbort = () => {
        drop();
        if (timer) clearTimeout(timer);
        reject(signal!.reason);
      };
      if (timeoutMs !== undefined) {
        timer = setTimeout(() => {
          drop();
          signal?.removeEventListener("abort", onAbort);
          resolve(TIMEOUT);
        }, timeoutMs);
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      this.waiters.push(done);
    });
  }
}

/** Waits ms, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  signal?.throwIfAborted();
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A mutex for async code: lock() resolves to the function that unlocks. */
export class Mutex {
  private tail: Promise<void> = Promise.resolve();
  private users = 0; // holders and waiters

  /** True when no one holds or waits for the lock. */
  get idle(): boolean {
    return this.users === 0;
  }

  async lock(): Promise<() => void> {
    this.users++;
    let release!: () => void;
    const next = new Promise<void>((r) => (release = r));
    const prev = this.tail;
    this.tail = prev.then(() => next);
    await prev;
    let once = false;
    return () => {
      if (once) return;
      once = true;
      this.users--;
      release();
    };
  }

  async run<R>(fn: () => Promise<R>): Promise<R> {
    const unlock = await this.lock();
    try {
      return await fn();
    } finally {
      unlock();
    }
  }
}

/** A signal that aborts when any of the given ones does. */
export function anySignal(...signals: (AbortSignal | undefined)[]): AbortSignal {
  const live = signals.filter((s): s is AbortSignal => s !== undefined);
  return live.length === 1 ? live[0] : AbortSignal.any(live);
}

/** A ClosedError to abort with. */
export function closedReason(what: string): ClosedError {
  return new ClosedError(what);
}

/**
 * The subject token of a session id (docs/PROTOCOL.md §2.2): the id
 * itself when it is 1 to 128 of [A-Za-z0-9_-], else "~" and the unpadded
 * base64url of its UTF-8 bytes.
 */
export function subjectToken(id: string): string {
  if (/^[A-Za-z0-9_-]{1,128}$/.test(id)) return id;
  return "~" + base64url(new TextEncoder().encode(id));
}

/** The unpadded base64url of bytes. */
export function base64url(bytes: Uint8Array): string {
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin).replace(/=+$/, "").replace(/\+/g, "-").replace(/\//g, "_");
}

/** What setTimeout returns, in Node (an object) and in a browser (a number). */
export type Timer = ReturnType<typeof setTimeout>;

/**
 * The timer, which no longer keeps a Node process alive (unref); in a
 * browser, where timers have no unref, as it is.
 */
export function unref<T extends Timer>(t: T): T {
  (t as { unref?: () => void }).unref?.();
  return t;
}

/**
 * A random (version 4) UUID: crypto.randomUUID where it is (Node, and a
 * page in a secure context: https, file, localhost, an Electron app's
 * privileged scheme), else one made the same way from getRandomValues,
 * which every page has.
 */
export function uuid(): string {
  const c = globalThis.crypto;
  if (typeof c.randomUUID === "function") return c.randomUUID();
  const b = c.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** p, or the signal's reason when it aborts first. */
export function raceAbort<T>(p: Promise<T>, signal?: AbortSignal): Promise<T> {
  if (!signal) return p;
  signal.throwIfAborted();
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (e) => {
        signal.removeEventListener("abort", onAbort);
        reject(e);
      },
    );
  });
}

/** v when it is a positive finite number, else the default. */
export function positive(v: number | undefined, def: number): number {
  return typeof v === "number" && v > 0 && Number.isFinite(v) ? v : def;
}

/** Why id is no session id (wire.ValidateID), or undefined when it is one. */
export function badSessionId(id: unknown): string | undefined {
  if (typeof id !== "string") return `not a string (${typeof id})`;
  if (id === "") return "required";
  const bytes = new TextEncoder().encode(id); // a lone surrogate becomes U+FFFD
  if (bytes.length > 256) return "longer than 256 bytes";
  if (new TextDecoder().decode(bytes) !== id) return "not valid UTF-8"; // a lone surrogate
  for (const ch of id) {
    const c = ch.codePointAt(0)!;
    if (c < 0x20 || c === 0x7f || (c >= 0x80 && c < 0xa0)) return "contains a control character";
  }
  return undefined;
}

/** Throws the broker's INVALID_PARAMS, as `what`'s, when id is no session id. */
export function checkSessionId(what: string, id: unknown): asserts id is string {
  const bad = badSessionId(id);
  if (bad !== undefined) {
    throw new A2ABusError(what, { code: Codes.INVALID_PARAMS, message: `id: ${bad} (a session id is 1 to 256 bytes of UTF-8 without control characters)`, data: { code: "INVALID_PARAMS" } });
  }
}
