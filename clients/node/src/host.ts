import { EventEmitter } from "node:events";

import { A2ABusError, BrokerStartError, ClosedError, ForeignBrokerError, RefusedError } from "./errors.js";
import { quiet, type Bus, type Logger } from "./bus.js";
import { DEFAULT_CALL_TIMEOUT_MS, withDeadline } from "./deadline.js";
import type { HostEvents, Tell } from "./host-events.js";
import { DEFAULT_HEALTH_TIMEOUT_MS } from "./health.js";
import { brokerBinary } from "./binary.js";
import { NatsBus, type NatsMode } from "./nats.js";
import { PipeBus } from "./pipe.js";
import { Session, type Retry } from "./runtime.js";
import { checkSessionId, positive } from "./util.js";
import type { HostCallArgs, HostMethod, ResultOf } from "./methods.js";
import type { PageCredentials } from "./browser.js";

export interface HostOptions {
  /** Which bus: "nats" (the default) or "pipe". */
  bus?: "nats" | "pipe";
  /**
   * The a2a-bus binary to start (default: brokerBinary(), this platform's
   * package's, else "a2a-bus" from PATH): as a
   * sidecar on NATS, as a child on the pipe. On NATS, leave it out and
   * give connectionFile to join a broker that is already running.
   */
  binary?: string;
  /**
   * NATS: how the host comes to its broker.
   * - "start-or-join" (the default): it joins the broker of the connection
   *   file when one answers, else it starts one; when that finds a broker
   *   already running (another app instance started one meanwhile), it
   *   joins that one. Two hosts opening together end on one broker.
   * - "start": it starts one, and fails with BrokerRunningError when one
   *   runs at the connection file.
   * - "join": it joins the broker of the connection file, and fails when
   *   none answers. The default when connectionFile is given without binary.
   */
  broker?: "start-or-join" | "start" | "join";
  /**
   * NATS: the connection file of the broker to join, and where a sidecar
   * this host starts writes its own. Default: `connection.json` in
   * dataDir when that is a folder (hosts on one data dir share its
   * broker); with dataDir "", one in a private temporary folder removed on
   * close (the host starts a broker of its own); with dataDir left out,
   * serve's (docs/PROTOCOL.md §2.2). Given without binary (and no broker
   * option), the host only joins. A file whose url is not on loopback, or
   * whose pid is another user's process, is refused (ForeignBrokerError);
   * one whose pid no longer runs is stale: no broker.
   */
  connectionFile?: string;
  /**
   * Where a broker this host starts keeps its durable store: its tasks and
   * the registrations of its live delegates, so that a broker that
   * restarts (the host starts it again) has every acknowledged task, and
   * gives each delegate that registers again under its instance id its
   * old name back.
   *
   * - undefined (left out): the platform's state folder, serve's own
   *   default and the one a sidecar uses (`$XDG_STATE_HOME/a2a-bus`, else
   *   `~/.local/state/a2a-bus` on Linux, `~/Library/Application
   *   Support/a2a-bus` on macOS, `%LocalAppData%\a2a-bus` on Windows);
   * - `""`: memory. A restart loses the tasks and the names; a delegate
   *   that knew a task as open is told in its resync (`Resync.lost`);
   * - a path: that folder. On NATS it holds the connection file too,
   *   unless connectionFile is given.
   *
   * One data dir serves one broker at a time: a second broker started on
   * it is refused, and open fails saying so (BrokerRunningError). Join the
   * running broker with its connection file (bus "nats", `connectionFile`,
   * no `binary`), or give this host its own dataDir. A host that joins
   * starts no broker on it; a folder still says where its connection file
   * is (above).
   */
  dataDir?: string;
  /** More `serve` flags for a broker this host starts (`--max-tasks-per-context=8`). */
  args?: string[];
  /**
   * How long a call may take in all (ms, default 10 000): a delegate's
   * call (spawn, send, push, reply, get, list, update, cancel, settle,
   * peers), host.session and host.callHost, with every retry of it and
   * every wait for a broker that is away. Past it the call fails with
   * UnavailableError (a change may or may not have been applied: sent
   * again with its messageId it is applied once). A signal given to the
   * call ends it sooner. A host that would rather wait out a broker that
   * is stuck (found and replaced within about twice healthTimeoutMs) sets
   * it longer than that.
   */
  callTimeoutMs?: number;
  /**
   * How long the broker has to answer a health check (a2a.admin.info)
   * before the host takes it for dead (ms, default 5 000). The host checks
   * when a call has waited this long, and every 10 s while it hears
   * nothing from the broker. A dead broker is replaced: a child or a
   * sidecar this host started is killed (SIGKILL) and started again on
   * the same data dir; a broker it joined is dialled again from its
   * connection file. Waiting delegates resync as after a restart.
   *
   * Five seconds: a broker on the same machine answers in a millisecond
   * or two, a busy one well within a second, so a broker silent for five
   * is stuck (stopped, deadlocked, its disk hung), not slow; and a
   * delegate waiting on it is served again within about ten (a stalled
   * call noticed, then the check's deadline). A check whose deadline fired
   * late because this process itself did not run (a laptop lid, a
   * debugger) is made again before anything is killed.
   */
  healthTimeoutMs?: number;
  /**
   * About how often a waiting delegate's session checks for an event lost
   * with no signal (ms, default 30 000, each wait drawn from 80 % to 120 %
   * of it); a loss it is told of it replays at once.
   */
  checkMs?: number;
  /** How a change whose answer was lost is tried again; what is left out (or not positive) is the default's. */
  retry?: Partial<Retry>;
  /** How many events a delegate's wait queue holds (default 4 096). */
  queue?: number;
  /** Where logs go (console fits); the default drops them. */
  logger?: Logger;
  /** @internal NATS: how long a sidecar has to say it is ready (ms, default 30 000); for tests. */
  startTimeoutMs?: number;
}

/**
 * A host's handle on the broker: it starts or joins it, rejoins it when it
 * restarts, and gives a runtime per chat session. It emits what happens
 * to its broker and sessions (HostEvents): `brokerExit`, `rejoined`,
 * `resync`, `renamed`, `lost`.
 *
 * ```js
 * const host = await Host.open(); // joins the running broker, or starts one
 * host.on("brokerExit", (ev) => console.warn("broker gone:", ev.reason));
 * const chat = await host.session("chat-1");
 * const d = await chat.spawn({ name: "discussant" });
 * ```
 */
export class Host extends EventEmitter<HostEvents> {
  private sessions = new Set<Session>();
  private closed = false;
  /** @internal */ readonly bus: Bus;
  private readonly callTimeoutMs: number;

  private constructor(
    private readonly o: HostOptions,
    bus: (tell: Tell) => Bus,
  ) {
    super();
    this.callTimeoutMs = positive(o.callTimeoutMs, DEFAULT_CALL_TIMEOUT_MS);
    this.bus = bus(this.tell);
  }

  static async open(o: HostOptions = {}): Promise<Host> {
    try {
      return await Host.start(o);
    } catch (err) {
      throw asStartError(err);
    }
  }

  private static async start(o: HostOptions): Promise<Host> {
    const kind = o.bus ?? "nats";
    const common = {
      dataDir: o.dataDir, // undefined: no --data-dir, serve's default
      args: o.args ?? [],
      callTimeoutMs: positive(o.callTimeoutMs, DEFAULT_CALL_TIMEOUT_MS),
      healthTimeoutMs: positive(o.healthTimeoutMs, DEFAULT_HEALTH_TIMEOUT_MS),
      logger: o.logger ?? quiet,
    };
    let host: Host;
    if (kind === "pipe") {
      host = new Host(o, (tell) => new PipeBus({ ...common, tell, command: [o.binary ?? brokerBinary()], maxMessageBytes: messageLimit(common.args), maxLineBytes: lineLimit(common.args) }));
    } else if (kind === "nats") {
      const mode = natsMode(o);
      host = new Host(
        o,
        (tell) =>
          new NatsBus({
            ...common,
            tell,
            mode,
            command: mode === "join" ? undefined : [o.binary ?? brokerBinary()],
            connectionFile: o.connectionFile,
            messageLimit: givenMessageLimit(common.args),
            startTimeoutMs: o.startTimeoutMs,
          }),
      );
    } else {
      throw new TypeError(`unknown bus ${JSON.stringify(kind)} (want nats or pipe)`);
    }
    const bus = host.bus as PipeBus | NatsBus;
    try {
      await bus.start();
    } catch (err) {
      await bus.close(); // a child that started is stopped, and not started again
      throw err;
    }
    return host;
  }

  /** Emits an event for the bus and the sessions; a listener that throws does not disturb them. */
  private readonly tell: Tell = (name, ev) => {
    try {
      (this.emit as (name: string, ev: unknown) => boolean)(name, ev);
    } catch (err) {
      process.nextTick(() => {
        throw err;
      });
    }
  };

  /** "nats" or "pipe". */
  get kind(): "nats" | "pipe" {
    return this.bus.kind;
  }

  /**
   * The broker's process id while the host is on it: undefined from when
   * the host knows it gone (its process exited, its connection was lost,
   * it was taken for dead) until the host is on a broker again.
   */
  get brokerPid(): number | undefined {
    return this.bus.pid();
  }

  /**
   * Whether the broker the host is on is one it started, which close
   * stops; false when it joined one (or is between brokers).
   */
  get startedBroker(): boolean {
    return this.bus.started();
  }

  /** How many times the host reached a new broker after losing one. */
  get rejoins(): number {
    return this.bus.rejoins();
  }

  describe(): string {
    return this.bus.describe();
  }

  /**
   * A runtime for one chat session: on NATS it opens the session's own
   * credential, so that the server itself keeps it to its own subjects.
   */
  async session(id: string, opts: { signal?: AbortSignal } = {}): Promise<Session> {
    if (this.closed) throw new ClosedError("the host is closed");
    checkSessionId("host.session", id);
    const link = this.bus.session(id);
    let s: Session;
    try {
      s = await withDeadline(this.callTimeoutMs, `session ${id}`, opts.signal, (signal) =>
        Session.open(
          link,
          {
            checkMs: this.o.checkMs,
            retry: this.o.retry,
            queue: this.o.queue,
            callTimeoutMs: this.callTimeoutMs,
            logger: this.o.logger ?? quiet,
            onEnd: (s) => this.sessions.delete(s),
            tell: this.tell,
          },
          signal,
        ),
      );
    } catch (err) {
      await link.close(false);
      throw err;
    }
    if (this.closed) {
      // The host closed while the session opened: it is not handed out.
      await s.leave();
      throw new ClosedError("the host is closed");
    }
    this.sessions.add(s);
    return s;
  }

  /**
   * A new credential of session id for a page to connect with over
   * WebSocket (an Electron renderer: connectSession of
   * `@a2a-bus/host/browser`, whose credentials callback this answers,
   * through the app's preload bridge). It opens one with
   * a2a.sessions.open (new on every call; the broker keeps the session to
   * its own subjects), waiting for the broker as any call does. The broker
   * must have its WebSocket listener on (serve's --ws-listen, in `args`
   * for a broker this host starts); else this rejects with RefusedError.
   * A page cannot revoke its credential: when its window goes, revoke them
   * all with `callHost("a2a.sessions.close", { contextId: id, keepAgents })`.
   */
  async sessionCredentials(id: string, opts: { signal?: AbortSignal } = {}): Promise<PageCredentials> {
    if (this.closed) throw new ClosedError("the host is closed");
    checkSessionId("host.sessionCredentials", id);
    if (this.bus.kind !== "nats") throw new RefusedError(`session ${id}: a page connects over WebSocket, to a broker on NATS; this host is on the ${this.bus.kind}`);
    const creds = await this.callHost("a2a.sessions.open", { contextId: id }, opts);
    if (!creds?.wsUrl) {
      throw new RefusedError(`session ${id}: the broker has no WebSocket listener, so a page cannot connect: start it with --ws-listen 127.0.0.1:0 (HostOptions.args)`);
    }
    return { url: creds.url, user: creds.user, password: creds.password, wsUrl: creds.wsUrl };
  }

  /**
   * A host-only call (a2a.sessions.*, a2a.admin.*), typed by Methods: the
   * method names its params and its result.
   */
  callHost<M extends HostMethod>(method: M, ...[params, opts]: HostCallArgs<M>): Promise<ResultOf<M>> {
    return withDeadline(this.callTimeoutMs, method, opts?.signal, (signal) => this.bus.callHost(method, params ?? {}, signal)) as Promise<ResultOf<M>>;
  }

  /**
   * Leaves every session (its delegates stay registered, as when the host
   * dies) and stops a broker this host started. Idempotent.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await Promise.all([...this.sessions].map((s) => s.leave().catch(() => {})));
    await this.bus.close();
  }
}

/** How a NATS host comes to its broker: as it says, else join a connection file given alone, else start or join. */
function natsMode(o: HostOptions): NatsMode {
  switch (o.broker) {
    case undefined:
      return o.binary === undefined && o.connectionFile !== undefined ? "join" : "start-or-join";
    case "start-or-join":
    case "start":
    case "join":
      return o.broker;
  }
  throw new TypeError(`unknown broker ${JSON.stringify(o.broker)} (want start-or-join, start or join)`);
}

/**
 * The message limit of a broker started with these args when they, or
 * the environment, say it (--max-message-bytes, A2A_BUS_MAX_MESSAGE_BYTES);
 * undefined when it is serve's default or may come from a --config file.
 */
function givenMessageLimit(args: string[]): number | undefined {
  const given = args.some((a) => /^--?max-message-bytes(?:=|$)/.test(a)) || !!process.env.A2A_BUS_MAX_MESSAGE_BYTES;
  return given ? messageLimit(args) : undefined;
}

/**
 * The message limit a broker started with these args has:
 * --max-message-bytes, else A2A_BUS_MAX_MESSAGE_BYTES (the child inherits
 * the environment), else 1 MiB. A limit set in a --config file is not
 * seen: such a broker's refusal of a larger request comes as a lost answer.
 */
export function messageLimit(args: string[]): number {
  let v: string | undefined;
  for (let i = 0; i < args.length; i++) {
    const m = /^--?max-message-bytes(?:=(.*))?$/.exec(args[i]);
    if (m) v = m[1] ?? args[i + 1];
  }
  v ??= process.env.A2A_BUS_MAX_MESSAGE_BYTES || undefined;
  return positive(v === undefined ? undefined : Number(v), 1 << 20);
}

/** wire.MinPayload and wire.MaxPayload: the bounds of a broker's payload limit. */
const MIN_PAYLOAD = 8 << 20;
const MAX_PAYLOAD = 64 << 20;

/**
 * The longest line a broker started with these args writes on the pipe:
 * its payload limit, which derives from its message limit as wire.NewLimits
 * derives it (eight times it, within 8 and 64 MiB: 8 MiB by default). No
 * response or notification is longer. When the message limit may come
 * from a --config file (given in args or A2A_BUS_CONFIG, and neither
 * --max-message-bytes nor A2A_BUS_MAX_MESSAGE_BYTES), the largest payload
 * any broker has, 64 MiB, as the Go host reads.
 */
export function lineLimit(args: string[]): number {
  const named = (flag: string) => args.some((a) => new RegExp(`^--?${flag}(?:=|$)`).test(a));
  const limitGiven = named("max-message-bytes") || !!process.env.A2A_BUS_MAX_MESSAGE_BYTES;
  if (!limitGiven && (named("config") || !!process.env.A2A_BUS_CONFIG)) return MAX_PAYLOAD;
  return Math.min(Math.max(8 * messageLimit(args), MIN_PAYLOAD), MAX_PAYLOAD);
}

/**
 * Every failure of Host.open to reach a broker is a BrokerStartError
 * (or a ForeignBrokerError, a TypeError for a bad option, a broker's own
 * error): one that arose as a plain Error (a connection file that cannot
 * be read, a broker that does not answer its greeting) is wrapped, with
 * it as the cause.
 */
function asStartError(err: unknown): unknown {
  if (!(err instanceof Error) || err instanceof BrokerStartError || err instanceof ForeignBrokerError || err instanceof A2ABusError || err instanceof TypeError) {
    return err;
  }
  return new BrokerStartError(`a2a-bus: the host could not reach a broker: ${err.message}`, { cause: err });
}
