import { spawn, type ChildProcess } from "node:child_process";

import { A2ABusError, ClosedError, UnavailableError, invalidRequest, tooLarge } from "./errors.js";
import {
  SUBSCRIPTION_QUEUE,
  resultOf,
  sessionOf,
  type Bus,
  type Logger,
  type Notification,
  type SessionLink,
  type Subscription,
} from "./bus.js";
import { tellNothing, type Tell } from "./host-events.js";
import { HEALTH_IDLE_MS, Watchdog } from "./health.js";
import { LineSplitter, stderrLines } from "./lines.js";
import { startFailure, type StartExit } from "./start.js";
import { Queue, raceAbort, sleep } from "./util.js";

export interface PipeOptions {
  /** The broker's command line; the pipe args are appended. */
  command: string[];
  /** The broker's message limit (--max-message-bytes): larger requests are refused here. */
  maxMessageBytes: number;
  /**
   * The longest line the broker can write (its payload limit): a longer
   * one is not read, and the child is taken for broken and replaced.
   */
  maxLineBytes: number;
  /** How long the child has to answer a health check before it is killed and started again (ms). */
  healthTimeoutMs: number;
  /** --data-dir; undefined passes none (serve's default, the platform's state folder), "" keeps tasks in memory. */
  dataDir: string | undefined;
  args: string[];
  callTimeoutMs: number;
  logger: Logger;
  /** Where the bus tells its host that the broker went, and that it is on one again. */
  tell?: Tell;
}

/**
 * How long a new child has to answer its first probe before it is taken
 * for stuck: a broker opening a large store takes a while.
 */
const START_TIMEOUT_MS = 30_000;

interface Pending {
  method: string;
  resolve: (v: any) => void;
  reject: (e: Error) => void;
}

/**
 * The pipe: `a2a-bus serve --bus=pipe` as a child, one JSON-RPC object per
 * line on its stdio (docs/PROTOCOL.md §2.1). The host owns the pipe and
 * routes each notification to the session its recipientContextId names.
 * A child that dies is started again on the same data dir (50 ms, doubling
 * to 1 s while it keeps dying young); calls made meanwhile wait for it.
 * A child that is alive but stuck is killed (SIGKILL) and started again
 * likewise: one that does not answer a health check within
 * healthTimeoutMs (checked when a call stalls, and every 10 s while it
 * says nothing), or that writes a line longer than any broker writes.
 */
export class PipeBus implements Bus {
  readonly kind = "pipe" as const;
  private child?: ChildProcess;
  private ready?: ChildProcess; // the child that has answered
  private childUp?: Promise<void>; // resolves when the current child first answers
  private exited?: Promise<void>; // resolves when the current child is gone
  private nextId = 1;
  private pending = new Map<number, Pending>();
  private subs = new Map<string, Set<Queue<Notification>>>();
  private closed = false;
  private starts = 0;
  private backoff = 50;
  private lastWords: string[] = []; // the broker's last lines on stderr, for an error
  private dog?: Watchdog; // the current child's, once it has answered
  private condemned = new WeakSet<ChildProcess>(); // children being killed as broken
  private condemnedFor = new WeakMap<ChildProcess, string>(); // why
  private readonly tell: Tell;

  constructor(private readonly o: PipeOptions) {
    this.tell = o.tell ?? tellNothing;
  }

  /** Starts the first child; rejects with a BrokerStartError when it ends before it answers. */
  async start(): Promise<void> {
    this.launch();
    const child = this.child!;
    const died = new Promise<never>((_, reject) => {
      const fail = (exit: StartExit) => reject(startFailure("a2a-bus serve --bus=pipe", exit, [...this.lastWords]));
      child.on("error", (error) => {
        if (child.pid === undefined) fail({ code: null, signal: null, error });
      });
      child.once("close", (code, signal) => fail({ code, signal }));
    });
    died.catch(() => {});
    await Promise.race([this.childUp, died]);
  }

  /**
   * Starts a child. It counts as up once it answers a probe (a replay
   * that asks where a session stands, which every broker answers); calls
   * wait for that.
   */
  private launch(): void {
    const [cmd, ...pre] = this.o.command;
    const dataDir = this.o.dataDir === undefined ? [] : [`--data-dir=${this.o.dataDir}`];
    const child = spawn(cmd, [...pre, "serve", "--bus=pipe", "--exit-with-parent", ...dataDir, ...this.o.args], {
      stdio: ["pipe", "pipe", "pipe"],
    });
    this.child = child;
    this.starts++;
    let upAt: number | undefined;
    let markUp!: () => void;
    this.childUp = new Promise((r) => (markUp = r));
    let dog: Watchdog | undefined;
    let garbled = false; // told once per child
    child.stdin!.on("error", () => {}); // a dead child's stdin: its exit is handled below
    const lines = new LineSplitter(
      this.o.maxLineBytes,
      (line) => {
        if (this.condemned.has(child)) return; // what it still writes is not read
        if (!this.onLine(line) && !garbled) {
          garbled = true;
          this.o.logger.warn("the broker wrote a line that is not a JSON-RPC object; skipped, and the broker checked");
          if (dog) dog.suspect("it wrote a line that is not a JSON-RPC object");
          else this.condemn(child, "it wrote a line that is not a JSON-RPC object before it answered");
        }
      },
      () => this.condemn(child, `it wrote a line longer than ${this.o.maxLineBytes} bytes, more than any broker writes`),
    );
    child.stdout!.on("data", (chunk: Buffer) => {
      if (!this.condemned.has(child)) lines.push(chunk);
    });
    stderrLines(child.stderr!, (line) => {
      this.lastWords.push(line);
      if (this.lastWords.length > 3) this.lastWords.shift();
      this.o.logger.debug(`broker: ${line}`);
    });
    // A child that never answers its first probe is stuck too.
    const starting = setTimeout(() => {
      if (upAt === undefined) this.condemn(child, `it did not answer within ${START_TIMEOUT_MS} ms of starting`);
    }, START_TIMEOUT_MS);
    starting.unref();
    this.exited = new Promise((resolve) => {
      child.once("error", (err) => this.o.logger.warn(`the broker could not start: ${err.message}`));
      child.once("close", (code, sig) => {
        resolve();
        clearTimeout(starting);
        dog?.stop();
        if (this.dog === dog) this.dog = undefined;
        if (this.child !== child) return;
        this.child = this.ready = this.childUp = undefined;
        const lost = this.closed ? new ClosedError("the host is closed") : new UnavailableError(`the broker exited (${sig ?? code})`);
        for (const p of this.pending.values()) p.reject(lost);
        this.pending.clear();
        for (const set of this.subs.values()) for (const q of set) q.end();
        this.subs.clear();
        if (this.closed) return;
        if (upAt !== undefined) {
          const why = this.condemnedFor.get(child);
          this.tell("brokerExit", { pid: child.pid, started: true, code, signal: sig, reason: why ?? `the broker exited (${sig ?? code})` });
        }
        // A child that keeps dying young is started less and less often.
        this.backoff = upAt !== undefined && Date.now() - upAt >= STEADY_MS ? 50 : Math.min(this.backoff * 2, 1000);
        this.o.logger.warn(`the broker exited (${sig ?? code}); starting it again in ${this.backoff} ms`);
        setTimeout(() => {
          if (!this.closed && !this.child) this.launch();
        }, this.backoff).unref();
      });
    });
    child.once("spawn", () => {
      const id = this.nextId++;
      this.pending.set(id, {
        method: "a2a.events.replay",
        resolve: () => {
          upAt = Date.now();
          clearTimeout(starting);
          if (this.child !== child) return;
          this.ready = child;
          dog = this.dog = new Watchdog({
            timeoutMs: this.o.healthTimeoutMs,
            idleMs: HEALTH_IDLE_MS,
            probe: () => this.probe(child),
            dead: (why) => this.condemn(child, why),
            logger: this.o.logger,
          });
          markUp();
          if (this.starts > 1) this.tell("rejoined", { pid: child.pid, started: true, description: this.describe(), rejoins: this.rejoins() });
        },
        reject: () => {}, // it died first: its close starts the next
      });
      child.stdin!.write(JSON.stringify({ jsonrpc: "2.0", id, method: "a2a.events.replay", params: { contextId: "a2a-bus-node-probe" } }) + "\n");
    });
  }

  /**
   * Takes a child that is alive but broken (stuck, or writing what no
   * broker writes) for dead: it is killed, and its exit starts the next
   * on the same data dir. Told once.
   */
  private condemn(child: ChildProcess, why: string): void {
    if (this.closed || this.child !== child || child.exitCode !== null || child.signalCode !== null) return;
    if (this.condemned.has(child)) return;
    this.condemned.add(child);
    this.condemnedFor.set(child, why);
    this.o.logger.warn(`the broker (pid ${child.pid}) is taken for dead: ${why}; killing it and starting it again`);
    child.kill("SIGKILL");
  }

  /** One a2a.admin.info on this child: resolves when it answers, whatever the answer. */
  private probe(child: ChildProcess): Promise<void> {
    if (this.child !== child || !child.stdin?.writable) return Promise.reject(new UnavailableError("the broker is gone"));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { method: "a2a.admin.info", resolve: () => resolve(), reject: (e) => (e instanceof A2ABusError ? resolve() : reject(e)) });
      child.stdin!.write(JSON.stringify({ jsonrpc: "2.0", id, method: "a2a.admin.info", params: {} }) + "\n");
    });
  }

  /** Handles one line of the broker's; false when it is no JSON-RPC object (no broker writes one). */
  private onLine(raw: Buffer): boolean {
    let i = 0;
    while (i < raw.length && (raw[i] === 0x20 || raw[i] === 0x09 || raw[i] === 0x0d)) i++;
    if (i === raw.length) return true; // blank
    if (raw[i] !== 0x7b) return false; // "{": anything else is no JSON-RPC object, and not worth parsing
    const line = raw.toString("utf8");
    let msg: any;
    try {
      msg = JSON.parse(line);
    } catch {
      return false;
    }
    if (!msg || typeof msg !== "object" || Array.isArray(msg)) return false;
    if ("id" in msg && !("method" in msg)) {
      this.dog?.heard();
      if (msg.id === null && msg.error) {
        this.o.logger.warn(`the broker refused a request it could not read: ${msg.error.message}`);
        return true;
      }
      const p = this.pending.get(msg.id);
      if (!p) return true; // a call given up on
      this.pending.delete(msg.id);
      try {
        p.resolve(resultOf(p.method, msg));
      } catch (err) {
        p.reject(err as Error);
      }
      return true;
    }
    if (typeof msg.method === "string" && msg.params && typeof msg.params === "object") {
      const id = sessionOf(msg);
      const set = id === undefined ? undefined : this.subs.get(id);
      if (set) for (const q of set) q.put(msg);
    }
    return true;
  }

  /** Waits until a child that has answered runs, callTimeoutMs at most. */
  private async live(method: string, signal?: AbortSignal): Promise<ChildProcess> {
    let deadline: AbortSignal | undefined;
    for (;;) {
      if (this.closed) throw new ClosedError("the host is closed");
      const child = this.child;
      const dying = child !== undefined && this.condemned.has(child);
      if (child && child === this.ready && !dying && child.stdin?.writable) return child;
      deadline ??= AbortSignal.timeout(this.o.callTimeoutMs);
      // Starting: its first answer, or its end. Dying: its end. Between two: a moment.
      const next = child === undefined ? sleep(50) : child === this.ready || dying ? this.exited! : Promise.race([this.childUp!, this.exited!]);
      try {
        await raceAbort(next, signal ? AbortSignal.any([signal, deadline]) : deadline);
      } catch (err) {
        if (signal?.aborted) throw signal.reason;
        throw new UnavailableError(`${method}: no broker within ${this.o.callTimeoutMs} ms`, { cause: err });
      }
    }
  }

  private async rawCall(method: string, params: object, signal?: AbortSignal): Promise<any> {
    const id = this.nextId++;
    const line = JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n";
    const size = Buffer.byteLength(line) - 1;
    if (size > this.o.maxMessageBytes) {
      // The broker would answer -32600 with "id": null, which no call can
      // be matched with: refuse it here, as that answer.
      throw tooLarge(method, size, this.o.maxMessageBytes);
    }
    if (nestedDeeper(line, MAX_DEPTH)) {
      // Refused likewise with "id": null (docs/PROTOCOL.md §11).
      throw invalidRequest(method, `message nests arrays and objects deeper than ${MAX_DEPTH} levels`);
    }
    const child = await this.live(method, signal);
    return new Promise((resolve, reject) => {
      const timeout = AbortSignal.timeout(this.o.callTimeoutMs);
      // A call that stalls past the health deadline has the broker checked.
      const unwatch = this.dog?.watch();
      const done = () => {
        signal?.removeEventListener("abort", onAbort);
        timeout.removeEventListener("abort", onTimeout);
        unwatch?.();
      };
      const onAbort = () => {
        this.pending.delete(id);
        done();
        reject(signal!.reason);
      };
      const onTimeout = () => {
        // An answer that came while this process did not run (stopped,
        // its event loop blocked) is read after its timers: read it first.
        setImmediate(() => {
          if (this.pending.get(id) !== entry) return;
          this.pending.delete(id);
          done();
          reject(new UnavailableError(`${method}: no answer within ${this.o.callTimeoutMs} ms`));
        });
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      timeout.addEventListener("abort", onTimeout, { once: true });
      const entry: Pending = {
        method,
        resolve: (v) => {
          done();
          resolve(v);
        },
        reject: (e) => {
          done();
          reject(e);
        },
      };
      this.pending.set(id, entry);
      child.stdin!.write(line);
    });
  }

  callHost(method: string, params: object, signal?: AbortSignal): Promise<any> {
    return this.rawCall(method, params, signal);
  }

  session(id: string): SessionLink {
    return new PipeSession(this, id);
  }

  /** @internal */
  call(method: string, params: object, signal?: AbortSignal): Promise<any> {
    return this.rawCall(method, params, signal);
  }

  /** @internal */
  async subscribe(id: string, signal?: AbortSignal): Promise<Subscription> {
    await this.live("subscribe", signal);
    const q = new Queue<Notification>(SUBSCRIPTION_QUEUE);
    let set = this.subs.get(id);
    if (!set) this.subs.set(id, (set = new Set()));
    set.add(q);
    return {
      queue: q,
      close: () => {
        q.end();
        const s = this.subs.get(id);
        s?.delete(q);
        if (s?.size === 0) this.subs.delete(id);
      },
    };
  }

  /** The child's process id once it has answered; undefined while none runs, or the one there is dying or starting. */
  pid(): number | undefined {
    const c = this.ready;
    return c !== undefined && c === this.child && !this.condemned.has(c) ? c.pid : undefined;
  }

  /** The broker is always the host's own child. */
  started(): boolean {
    return this.pid() !== undefined;
  }

  rejoins(): number {
    return Math.max(this.starts - 1, 0);
  }

  describe(): string {
    return `a2a-bus serve --bus=pipe (pid ${this.child?.pid ?? "none"})`;
  }

  /**
   * Ends stdin, the pipe's clean shutdown: the broker answers what it has
   * read and exits; after 10 s it is killed.
   */
  async close(): Promise<void> {
    if (this.closed) return this.exited;
    this.closed = true;
    this.dog?.stop();
    const child = this.child;
    if (child) {
      child.stdin?.end();
      const t = setTimeout(() => child.kill("SIGKILL"), 10_000);
      await this.exited;
      clearTimeout(t);
    }
    const gone = new ClosedError("the host is closed");
    for (const p of this.pending.values()) p.reject(gone);
    this.pending.clear();
    for (const set of this.subs.values()) for (const q of set) q.end();
    this.subs.clear();
  }
}

/** How deeply a request may nest arrays and objects (docs/PROTOCOL.md §11). */
const MAX_DEPTH = 128;

/** Whether JSON text nests arrays and objects deeper than limit, the envelope included. */
function nestedDeeper(json: string, limit: number): boolean {
  let depth = 0;
  for (let i = 0; i < json.length; i++) {
    const c = json.charCodeAt(i);
    if (c === 0x22) {
      for (i++; i < json.length && json.charCodeAt(i) !== 0x22; i++) if (json.charCodeAt(i) === 0x5c) i++;
    } else if (c === 0x7b || c === 0x5b) {
      if (++depth > limit) return true;
    } else if (c === 0x7d || c === 0x5d) {
      depth--;
    }
  }
  return false;
}

/** How long a child must have run for the restart backoff to start over. */
const STEADY_MS = 5000;


class PipeSession implements SessionLink {
  private closed = false;
  private subs = new Set<Subscription>();

  constructor(
    private readonly bus: PipeBus,
    readonly id: string,
  ) {}

  call(method: string, params: object, signal?: AbortSignal): Promise<any> {
    if (this.closed) return Promise.reject(new ClosedError(`session ${this.id} is closed`));
    return this.bus.call(method, params, signal);
  }

  async subscribe(signal?: AbortSignal): Promise<Subscription> {
    if (this.closed) throw new ClosedError(`session ${this.id} is closed`);
    const sub = await this.bus.subscribe(this.id, signal);
    this.subs.add(sub);
    return {
      queue: sub.queue,
      close: () => {
        this.subs.delete(sub);
        sub.close();
      },
    };
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const s of this.subs) s.close();
    this.subs.clear();
  }
}
