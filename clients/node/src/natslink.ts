// What a session's side of the NATS binding needs of a connection, with
// nothing of Node's: the Node host's sessions (TCP connections) and a
// page's (WebSocket connections) share it.
import type { NatsConnection } from "@nats-io/nats-core";

import { A2ABusError, ClosedError, RefusedError, UnavailableError, tooLarge } from "./errors.js";
import { SUBSCRIPTION_QUEUE, resultOf, type Notification, type SessionLink, type Subscription } from "./bus.js";
import { Queue, raceAbort, sleep, subjectToken } from "./util.js";

const enc = new TextEncoder();

const MiB = 1 << 20;

/**
 * The message limit M of a broker whose payload limit is p: p is 8 × M
 * within 8 and 64 MiB (docs/PROTOCOL.md §11), so M is p / 8 between
 * them; at 8 MiB it is at most 1 MiB (the default, said: a smaller one
 * is not seen), at 64 MiB at most 16 MiB (the largest).
 */
export function messageLimitOfPayload(p: number): number {
  if (p <= 8 * MiB) return MiB;
  if (p >= 64 * MiB) return 16 * MiB;
  return Math.floor(p / 8);
}

/** What watches the calls on a broker: the Node host's health check. */
export interface Watch {
  /** Watches one call; returns what ends the watch. */
  watch(): () => void;
  /** The broker answered something. */
  heard(): void;
}

export interface RequestOptions {
  /** How long the answer may take (ms). */
  timeoutMs: number;
  signal?: AbortSignal;
  /** Watches the call, when anything does. */
  watch?: Watch;
  /** The error a failed call is once what made it is closed; undefined while it is open. */
  closed(): Error | undefined;
  /** The broker's message limit, for a request the server refused as over its payload limit. */
  messageLimit(nc: NatsConnection): number;
}

/**
 * One JSON-RPC request on a NATS connection, its answer decoded: the
 * result, or an A2ABusError for an error answer; UnavailableError when
 * the answer was lost; the signal's reason when it aborts first.
 */
export async function request(nc: NatsConnection, subject: string, method: string, params: object, o: RequestOptions): Promise<any> {
  const body = enc.encode(JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }));
  // A call that stalls past the health deadline has the broker checked.
  const unwatch = o.watch?.watch();
  let msg;
  try {
    msg = await raceAbort(nc.request(subject, body, { timeout: o.timeoutMs }), o.signal);
    o.watch?.heard();
  } catch (err) {
    if (o.signal?.aborted && err === o.signal.reason) throw err;
    const closed = o.closed();
    if (closed) throw closed;
    if (/max_payload/i.test(String((err as Error)?.message))) {
      // Over the server's payload limit, and so over the broker's
      // message limit, which is what the caller can act on: it never
      // left; it never will.
      throw tooLarge(method, body.length, o.messageLimit(nc));
    }
    throw new UnavailableError(`${method}: ${(err as Error).message}`, { cause: err });
  } finally {
    unwatch?.();
  }
  return resultOf(method, msg.json());
}

/** How a session's connection is made: at which generation of its source, and the dial. */
export interface Dial {
  /** The source's generation the connection belongs to. */
  gen: number;
  /**
   * Opens a connection with a credential of the session's, its inbox
   * prefix the one given (`_INBOX.<T>`). A rejection is tried again with
   * backoff, but for an A2ABusError (the broker refused to open the
   * session) and a TypeError (a credential that is none), which are final.
   */
  open(session: { id: string; inboxPrefix: string }): Promise<NatsConnection>;
}

/** @internal Where a NatsSessionLink gets its connections, and what it tells back. */
export interface SessionSource {
  /** How long a connection may take to be made in all, its retries included, and a call its answer (ms). */
  readonly timeoutMs: number;
  /**
   * The generation connections are opened at now: one opened at another
   * is stale and is opened again (the host's link to its broker was
   * remade); 0 while none can be.
   */
  gen(): number;
  /** Waits (the signal bounding the wait) until a connection can be opened; resolves to how. */
  ready(signal?: AbortSignal): Promise<Dial>;
  /** The error a failed call is once the source is closed; undefined while it is open. */
  closed(): Error | undefined;
  /** The broker's message limit, as the connection nc says it. */
  messageLimit(nc: NatsConnection): number;
  /** What watches the calls, when anything does. */
  watch(): Watch | undefined;
  /** Revokes the session's credentials, keeping its agents (a2a.sessions.close): a host can; a page cannot. */
  revoke?(id: string): Promise<void>;
  /** The link closed. */
  forget?(link: NatsSessionLink): void;
}

/**
 * A session's link on the NATS binding (docs/PROTOCOL.md §2.2): a
 * connection with the session's own credential, its inbox `_INBOX.<T>`,
 * its calls on `a2a.rpc.<T>`, its events on `a2a.session.<T>.events`.
 * The connection is made on first use, and made again (a new credential
 * from the source) once it closed or went stale.
 */
export class NatsSessionLink implements SessionLink {
  private conn?: { gen: number; nc: NatsConnection };
  private opening?: Promise<NatsConnection>;
  private closed = false;
  private readonly token: string;
  private subs = new Set<Subscription>();

  constructor(
    readonly id: string,
    private readonly source: SessionSource,
  ) {
    this.token = subjectToken(id);
  }

  /**
   * The session's connection, opened (again) when there is none for the
   * source's current generation: timeoutMs at most, trying again with
   * backoff while it cannot be made (the source went meanwhile, the server
   * refused it).
   */
  private async nc(signal?: AbortSignal): Promise<NatsConnection> {
    const c = this.conn;
    if (c && !this.closed && c.gen === this.source.gen() && !c.nc.isClosed()) return c.nc;
    const deadline = Date.now() + this.source.timeoutMs;
    let wait = 50;
    for (;;) {
      if (this.closed) throw new ClosedError(`session ${this.id} is closed`);
      const dial = await this.source.ready(signal);
      const c = this.conn;
      if (c && c.gen === dial.gen && !c.nc.isClosed()) return c.nc;
      this.opening ??= this.open(dial).finally(() => (this.opening = undefined));
      try {
        return await raceAbort(this.opening, signal);
      } catch (err) {
        if (err instanceof A2ABusError || err instanceof TypeError || (signal?.aborted && err === signal.reason)) throw err;
        if (this.closed) throw new ClosedError(`session ${this.id} is closed`);
        if (Date.now() + wait > deadline) {
          throw new UnavailableError(`session ${this.id}: no connection within ${this.source.timeoutMs} ms: ${(err as Error).message}`, { cause: err });
        }
        await sleep(wait, signal);
        wait = Math.min(wait * 2, 1000);
      }
    }
  }

  private async open(dial: Dial): Promise<NatsConnection> {
    const nc = await dial.open({ id: this.id, inboxPrefix: `_INBOX.${this.token}` });
    if (this.closed) {
      await nc.close();
      throw new ClosedError(`session ${this.id} is closed`);
    }
    const old = this.conn;
    this.conn = { gen: dial.gen, nc };
    if (old && !old.nc.isClosed()) void old.nc.close();
    return nc;
  }

  async call(method: string, params: object, signal?: AbortSignal): Promise<any> {
    const nc = await this.nc(signal);
    try {
      return await request(nc, `a2a.rpc.${this.token}`, method, params, {
        timeoutMs: this.source.timeoutMs,
        signal,
        watch: this.source.watch(),
        closed: () => this.source.closed(),
        messageLimit: (nc) => this.source.messageLimit(nc),
      });
    } catch (err) {
      if (this.closed && err instanceof UnavailableError) throw new ClosedError(`session ${this.id} is closed`);
      throw err;
    }
  }

  async subscribe(signal?: AbortSignal): Promise<Subscription> {
    const nc = await this.nc(signal);
    const sub = nc.subscribe(`a2a.session.${this.token}.events`);
    const q = new Queue<Notification>(SUBSCRIPTION_QUEUE);
    void (async () => {
      try {
        for await (const m of sub) {
          let n: unknown;
          try {
            n = m.json();
          } catch {
            continue; // not JSON: nothing a session can use
          }
          if (n && typeof n === "object" && !Array.isArray(n)) q.put(n as Notification);
        }
      } catch {
        // The subscription failed; it ends below.
      } finally {
        q.end();
      }
    })();
    // The server answers a subscription it refuses before the PONG of the
    // next PING, and nats.js closes it then: refused is an error here,
    // not a subscription that never brings anything.
    try {
      await nc.flush();
    } catch {
      // The connection went: the queue ends, and the feed subscribes again.
    }
    if (sub.isClosed() && !nc.isClosed()) {
      q.end();
      throw new RefusedError(`the server refused session ${this.id}'s subscription to its events`);
    }
    const handle: Subscription = {
      queue: q,
      close: () => {
        this.subs.delete(handle);
        sub.unsubscribe();
        q.end();
      },
    };
    this.subs.add(handle);
    return handle;
  }

  /** @internal Closes the session's connection of generation gen (its broker is taken for gone): it opens again on the next. */
  drop(gen: number): void {
    const c = this.conn;
    if (!c || c.gen !== gen) return;
    this.conn = undefined;
    void c.nc.close().catch(() => {});
  }

  async close(revoke = false): Promise<void> {
    if (this.closed) return;
    if (revoke && this.source.revoke) {
      // The broker revokes the credential and closes its connections.
      try {
        await this.source.revoke(this.id);
      } catch {
        // A broker that is gone has forgotten the credential anyway.
      }
    }
    this.closed = true;
    for (const s of this.subs) s.close();
    this.subs.clear();
    const c = this.conn;
    this.conn = undefined;
    if (c && !c.nc.isClosed()) await c.nc.close().catch(() => {});
    this.source.forget?.(this);
  }
}
