import { spawn, type ChildProcess } from "node:child_process";
import { connect as tcpConnect, isIP } from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { isAbsolute, join, resolve as resolvePath } from "node:path";

import { connect, type NatsConnection } from "@nats-io/transport-node";

import { A2ABusError, BrokerRunningError, BrokerStartError, ClosedError, ForeignBrokerError, UnavailableError } from "./errors.js";
import { defaultConnectionFile, readConnectionFile, type ConnectionInfo } from "./connfile.js";
import type { Bus, Logger, SessionLink } from "./bus.js";
import { tellNothing, type BrokerExitEvent, type Tell } from "./host-events.js";
import { HEALTH_IDLE_MS, Watchdog } from "./health.js";
import { stderrLines } from "./lines.js";
import { startFailure, type StartExit } from "./start.js";
import { messageLimitOfPayload, NatsSessionLink, request, type SessionSource } from "./natslink.js";
import { raceAbort, sleep } from "./util.js";
import type { SessionCredentials } from "./wire.gen.js";

export { messageLimitOfPayload };

/**
 * How the host comes to its broker:
 * - "join": the broker of the connection file, which must answer;
 * - "start": a sidecar it starts (command), which fails when one runs;
 * - "start-or-join": the broker of the connection file when one answers,
 *   else a sidecar it starts; when that finds a broker already running
 *   (another host started one meanwhile), that one.
 */
export type NatsMode = "join" | "start" | "start-or-join";

export interface NatsOptions {
  mode: NatsMode;
  /** The sidecar to start (its command line; serve's args are appended); modes start and start-or-join. */
  command?: string[];
  /**
   * The connection file: the sidecar's (--connection-file), or the one to
   * join. Undefined: `<dataDir>/connection.json` when dataDir is a path;
   * with dataDir "" (memory), a file in a private temporary folder of this
   * host's own, removed on close (mode "join": serve's default); with
   * dataDir undefined, serve's default.
   */
  connectionFile?: string;
  /** --data-dir; undefined passes none (serve's default, the platform's state folder), "" keeps tasks in memory. */
  dataDir: string | undefined;
  args: string[];
  /**
   * The message limit of a sidecar this host starts, when its args or
   * environment say it; undefined: derived from the server's payload
   * limit (as for a broker it joined).
   */
  messageLimit?: number;
  callTimeoutMs: number;
  /** How long the broker has to answer a health check before it is taken for dead (ms). */
  healthTimeoutMs: number;
  logger: Logger;
  /** Where the bus tells its host that the broker went, and that it is on one again. */
  tell?: Tell;
  /** How long a sidecar has to print its connection file's path (ms, default START_TIMEOUT_MS). */
  startTimeoutMs?: number;
}

interface Link {
  gen: number;
  nc: NatsConnection;
  info: ConnectionInfo;
  /** The sidecar this host started, when the link was dialled while it ran. */
  child?: ChildProcess;
  /** Watches the broker while the link is up. */
  dog?: Watchdog;
  /** The broker did not answer a health check: the link is being dropped, for this reason. */
  dead?: string;
}

/** How a sidecar this host started ended. */
interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** How long a dial may take, the server's greeting included. */
const DIAL_TIMEOUT_MS = 2000;

/**
 * How long open waits for a broker that another host is starting (it
 * holds the connection file's lock, and has not written the file yet).
 */
const START_OR_JOIN_MS = 30_000;

/** How long a sidecar has to print its connection file's path before it is killed. */
const START_TIMEOUT_MS = 30_000;

/** How long a lost link waits for the exit of the sidecar it was on, for the brokerExit event. */
const EXIT_WAIT_MS = 2000;

/**
 * The NATS bus: the host credential (NATS token auth) on one connection,
 * and a connection per session with that session's own credential
 * (a2a.sessions.open), whose inbox prefix is `_INBOX.<T>`
 * (docs/PROTOCOL.md §2.2). When the broker goes away the host reads its
 * connection file again until it names a live broker (restarting the
 * sidecar first when it is the host's own child; starting one when it may
 * start one and none answers) and reconnects; each session opens its
 * credential again on first use. A broker that is alive but does not
 * answer a health check within healthTimeoutMs (checked when a call
 * stalls, and every 10 s while it says nothing) is taken for gone
 * likewise: its connections are dropped, and a sidecar the host started
 * is killed (SIGKILL) first, so that it is started again.
 */
export class NatsBus implements Bus {
  readonly kind = "nats" as const;
  private link?: Link;
  private linkUp: Promise<Link>;
  private setLink!: (l: Link) => void;
  private gen = 0;
  private closed = false;
  private child?: ChildProcess; // the sidecar this host started, while it runs or starts
  private childExited?: Promise<void>;
  private exits = new WeakMap<ChildProcess, Promise<Exit>>();
  private relaunching = false; // a restart of the sidecar is due
  private path?: string;
  private sessions = new Set<NatsSessionLink>();
  private backoff = 50;
  private supervisor?: Promise<void>;
  private readonly stopping = new AbortController(); // aborted by close
  private relaunches = 0; // how many times the sidecar came up again
  private nudge?: AbortController; // aborted when the sidecar is up again: the rejoin dials at once
  private readonly tell: Tell;
  private file?: string; // the connection file given to a sidecar: --connection-file
  private tempDir?: string; // the private folder of a memory host's connection file, removed on close
  private starting = new Set<() => void>(); // aborts the launches under way
  private readonly source: SessionSource; // where the sessions' links get their connections

  constructor(private readonly o: NatsOptions) {
    this.linkUp = new Promise((r) => (this.setLink = r));
    this.tell = o.tell ?? tellNothing;
    this.source = this.sessionSource();
  }

  async start(): Promise<void> {
    await this.pickFile();
    switch (this.o.mode) {
      case "join":
        this.path = this.file ?? (await defaultConnectionFile());
        this.up(await this.dial());
        return;
      case "start":
        this.path = await this.launch();
        this.up(await this.dial());
        return;
      case "start-or-join":
        this.up(await this.startOrJoin());
    }
  }

  /**
   * The connection file, when it is not serve's default: the one given;
   * else `<dataDir>/connection.json` for a data dir, so that hosts on one
   * data dir share its broker and hosts on others do not; else, for a host
   * in memory that may start its broker, a file in a fresh private folder
   * (removed on close), so that it starts its own and never joins one it
   * did not ask for.
   */
  private async pickFile(): Promise<void> {
    if (this.o.connectionFile !== undefined) {
      this.file = this.o.connectionFile;
    } else if (this.o.dataDir) {
      this.file = join(resolvePath(this.o.dataDir), "connection.json");
    } else if (this.o.dataDir === "" && this.o.mode !== "join") {
      this.tempDir = await mkdtemp(join(tmpdir(), "a2a-bus-host-"));
      this.file = join(this.tempDir, "connection.json");
    }
  }

  /**
   * Joins the broker of the connection file when it answers, else starts
   * one. A start refused because a broker now runs at the connection file
   * (another host started it meanwhile: two app instances opening
   * together) joins that one once it answers; until it does, or
   * START_OR_JOIN_MS have passed, both are tried again.
   */
  private async startOrJoin(): Promise<Link> {
    this.path = this.file ?? (await defaultConnectionFile());
    const end = Date.now() + START_OR_JOIN_MS;
    let wait = 50;
    for (;;) {
      let joinErr: unknown;
      try {
        return await this.dial();
      } catch (err) {
        if (err instanceof ForeignBrokerError) throw err; // not to be joined, nor replaced
        joinErr = err;
      }
      let running: BrokerRunningError;
      try {
        this.path = await this.launch();
        return await this.dial(); // ours: it wrote its file
      } catch (err) {
        if (!(err instanceof BrokerRunningError) || err.connectionFile === undefined) throw err;
        running = err;
      }
      this.path = running.connectionFile!;
      if (Date.now() + wait > end) {
        throw new BrokerRunningError(`${running.message}; it did not answer within ${START_OR_JOIN_MS} ms: ${(joinErr as Error)?.message}`, {
          cause: joinErr,
          exitCode: running.exitCode,
          signal: running.signal,
          output: running.output,
          connectionFile: running.connectionFile,
          pid: running.pid,
        });
      }
      this.o.logger.debug(`a broker is starting at ${this.path}: joining it`);
      await sleep(wait, this.stopping.signal);
      wait = Math.min(wait * 2, 1000);
    }
  }

  /**
   * Starts the sidecar and resolves with the path of its connection
   * file; rejects with a BrokerStartError when it does not get going (a
   * BrokerRunningError when another broker runs). One that got going and
   * then exits is started again.
   */
  private launch(): Promise<string> {
    const [cmd, ...pre] = this.o.command!;
    // The sidecar dies with this process (serve's default, said anyway).
    const args = [...pre, "serve", "--exit-with-parent", ...(this.o.dataDir === undefined ? [] : [`--data-dir=${this.o.dataDir}`]), ...this.o.args];
    if (this.file) args.push(`--connection-file=${this.file}`);
    const child = spawn(cmd, args, { stdio: ["ignore", "ignore", "pipe"] });
    this.child = child;
    const born = Date.now();
    const exited = new Promise<StartExit>((done) => {
      child.once("close", (code, signal) => done({ code, signal }));
      // It did not run at all (no such binary): no close may follow.
      child.on("error", (error) => {
        if (child.pid === undefined) done({ code: null, signal: null, error });
      });
    });
    this.exits.set(child, exited);
    this.childExited = exited.then(() => {});
    return new Promise((resolve, reject) => {
      let path: string | undefined; // its first line, once it is the connection file's path: it got going
      let first = true;
      let why: string | undefined; // it was killed before it got going, for this
      // One that never says its path is killed: its exit rejects.
      const stop = (reason: string) => {
        if (path !== undefined || why !== undefined) return;
        why = reason;
        child.kill("SIGKILL");
      };
      const ms = this.o.startTimeoutMs ?? START_TIMEOUT_MS;
      const timer = setTimeout(() => stop(`it did not say it was ready within ${ms} ms`), ms);
      timer.unref();
      const abort = () => stop("the host closed while it started");
      this.starting.add(abort);
      void exited.then(() => {
        clearTimeout(timer);
        this.starting.delete(abort);
      });
      const said: string[] = []; // its last lines, for the error when it never got going
      stderrLines(child.stderr!, (line) => {
        if (first) {
          first = false;
          if (isAbsolute(line) && why === undefined) {
            path = line;
            clearTimeout(timer);
            this.starting.delete(abort);
            resolve(line);
            return;
          }
        }
        if (path !== undefined) {
          this.o.logger.debug(`broker: ${line}`);
          return;
        }
        said.push(line);
        if (said.length > 4) said.shift();
      });
      void exited.then((exit) => {
        if (path === undefined) {
          // It never got going: its reason is among its last lines
          // (warnings held back until then come before it).
          if (this.child === child) this.child = undefined;
          if (why !== undefined) {
            reject(new BrokerStartError(`a2a-bus serve was stopped before it was ready: ${why}`, { exitCode: exit.code, signal: exit.signal, output: said }));
            return;
          }
          reject(startFailure("a2a-bus serve", exit, said));
          return;
        }
        if (this.child !== child || this.closed) return;
        this.child = undefined;
        this.o.logger.warn(`the broker exited (${exit.signal ?? exit.code}); starting it again`);
        this.backoff = Date.now() - born > 1000 ? 50 : Math.min(this.backoff * 2, 1000);
        this.relaunching = true;
        setTimeout(() => {
          this.relaunching = false;
          if (this.closed || this.child) return;
          this.launch().then(
            () => {
              // It wrote its connection file: rejoin now, not at the next backoff.
              this.relaunches++;
              this.nudge?.abort();
            },
            (err) => this.notStarted(err),
          );
        }, this.backoff).unref();
      });
    });
  }

  /**
   * A sidecar this host started again did not get going. One refused
   * because another broker now runs at the connection file: the host
   * joins that one. Else the rejoin starts one again as it dials.
   */
  private notStarted(err: unknown): void {
    if (err instanceof BrokerRunningError && err.connectionFile !== undefined) {
      this.o.logger.info(`another broker runs at ${err.connectionFile}: joining it`);
      this.path = err.connectionFile;
      this.nudge?.abort();
      return;
    }
    this.o.logger.warn(`the broker did not start again: ${(err as Error)?.message ?? err}`);
  }

  /** Reads the connection file and connects with its token. */
  private async dial(): Promise<Link> {
    const info = await readConnectionFile(this.path!);
    trusted(info, this.path!);
    if (!info.token) {
      throw new Error(`the broker of ${this.path} has no host token: a Node host needs serve's embedded NATS server`);
    }
    // A stopped broker's port accepts but never answers, and a dial that
    // times out leaves its socket open until the server answers or dies:
    // first see that it greets, on a socket of ours.
    await greets(info.url, DIAL_TIMEOUT_MS);
    const nc = await connect({
      servers: info.url,
      token: info.token,
      reconnect: false,
      name: "a2a-bus-node-host",
      timeout: DIAL_TIMEOUT_MS,
    });
    return { gen: ++this.gen, nc, info, child: this.child };
  }

  private up(link: Link): void {
    this.link = link;
    this.setLink(link);
    link.dog = new Watchdog({
      timeoutMs: this.o.healthTimeoutMs,
      idleMs: HEALTH_IDLE_MS,
      probe: () => this.request(link.nc, "a2a.host.rpc", "a2a.admin.info", {}).catch((err) => {
        if (!(err instanceof A2ABusError)) throw err; // an error answer is an answer
      }),
      dead: (why) => this.condemn(link, why),
      logger: this.o.logger,
    });
    this.supervisor = this.supervise(link);
  }

  /**
   * Takes a broker that does not answer for gone: a sidecar this host
   * started is killed (its exit starts it again), and the link's
   * connections are closed, which starts the rejoin. Told once.
   */
  private condemn(link: Link, why: string): void {
    if (link.dead || this.closed) return;
    link.dead = why;
    link.dog?.stop();
    const child = link.child;
    const own = child !== undefined && child === this.child && child.exitCode === null && child.signalCode === null;
    this.o.logger.warn(
      `the broker (pid ${link.info.pid}) is taken for dead: ${why}; ${own ? "killing it and starting it again" : "reconnecting from its connection file"}`,
    );
    if (own) child.kill("SIGKILL");
    this.down(link);
    for (const s of this.sessions) s.drop(link.gen);
    void link.nc.close().catch(() => {});
  }

  /** The link is no longer the current one: calls wait for the next. */
  private down(link: Link): void {
    if (this.link !== link) return;
    this.link = undefined;
    this.linkUp = new Promise((r) => (this.setLink = r));
  }

  /**
   * Waits for a link to end, then dials until a broker answers. A host
   * that may start a broker starts one when none answers and its own is
   * not running or due to start again: the broker it joined was stopped,
   * or its own could not start again.
   */
  private async supervise(link: Link): Promise<void> {
    await link.nc.closed();
    link.dog?.stop();
    if (this.closed) return;
    if (!link.dead) this.o.logger.info("lost the broker; rejoining");
    this.down(link);
    const told = this.tellExit(link);
    let wait = 50;
    while (!this.closed) {
      const relaunches = this.relaunches;
      try {
        const next = await this.dial();
        if (this.closed) {
          await next.nc.close();
          return;
        }
        this.o.logger.info(`rejoined the broker at ${next.info.url}`);
        this.up(next);
        void told.then(() => {
          if (this.closed || this.link !== next) return;
          this.tell("rejoined", { pid: next.info.pid, started: this.owns(next), description: this.describe(), rejoins: this.rejoins() });
        });
        return;
      } catch (err) {
        this.o.logger.debug(`rejoin: ${(err as Error).message}`);
        if (this.relaunches !== relaunches) continue; // the sidecar came up during the dial: again, now
        if (this.o.command && !this.child && !this.relaunching) {
          try {
            this.path = await this.launch();
            continue; // it wrote its file: dial it
          } catch (err) {
            if (this.closed) return;
            this.notStarted(err);
          }
        }
        const nudge = (this.nudge = new AbortController());
        try {
          await sleep(wait, AbortSignal.any([this.stopping.signal, nudge.signal]));
          wait = Math.min(wait * 2, 1000);
        } catch {
          if (this.stopping.signal.aborted) return; // closed
          // The sidecar is up again: dial now.
        } finally {
          if (this.nudge === nudge) this.nudge = undefined;
        }
      }
    }
  }

  /** Whether the link is on the sidecar this host started. */
  private owns(link: Link): boolean {
    return link.child !== undefined && link.child === this.child;
  }

  /** Emits brokerExit for a link lost, with its sidecar's exit when it was this host's and it exits. */
  private async tellExit(link: Link): Promise<void> {
    const ev: BrokerExitEvent = { pid: link.info.pid, started: link.child !== undefined, reason: link.dead ?? "the connection to the broker closed" };
    const exited = link.child && this.exits.get(link.child);
    if (exited) {
      let timer: NodeJS.Timeout | undefined;
      const exit = await Promise.race([exited, new Promise<undefined>((r) => (timer = setTimeout(() => r(undefined), EXIT_WAIT_MS)).unref())]);
      clearTimeout(timer);
      if (exit) {
        ev.code = exit.code;
        ev.signal = exit.signal;
        if (!link.dead) ev.reason = `the broker exited (${exit.signal ?? exit.code})`;
      }
    }
    if (!this.closed) this.tell("brokerExit", ev);
  }

  /** The current link, waiting for one while the broker is away (callTimeoutMs at most). */
  async current(signal?: AbortSignal): Promise<Link> {
    if (usable(this.link)) return this.link;
    const give = AbortSignal.timeout(this.o.callTimeoutMs);
    const both = signal ? AbortSignal.any([signal, give]) : give;
    for (;;) {
      if (this.closed) throw new ClosedError("the host is closed");
      if (usable(this.link)) return this.link;
      try {
        await raceAbort(this.linkUp, both);
      } catch (err) {
        if (signal?.aborted) throw signal.reason;
        throw new UnavailableError(`no broker within ${this.o.callTimeoutMs} ms`, { cause: err });
      }
    }
  }

  /** One request on a connection, its answer decoded; the current link's health check watches it. */
  request(nc: NatsConnection, subject: string, method: string, params: object, signal?: AbortSignal): Promise<any> {
    return request(nc, subject, method, params, {
      timeoutMs: this.o.callTimeoutMs,
      signal,
      watch: this.link?.dog,
      closed: () => (this.closed ? new ClosedError("the host is closed") : undefined),
      messageLimit: (nc) => this.messageLimit(nc),
    });
  }

  async callHost(method: string, params: object, signal?: AbortSignal): Promise<any> {
    const link = await this.current(signal);
    return this.request(link.nc, "a2a.host.rpc", method, params, signal);
  }

  session(id: string): SessionLink {
    const s = new NatsSessionLink(id, this.source);
    this.sessions.add(s);
    return s;
  }

  /**
   * Where the sessions' links get their connections: each opens its
   * session's credential (a2a.sessions.open) on the current link, and
   * connects with it to the url it names; a connection of an older link
   * is stale.
   */
  private sessionSource(): SessionSource {
    return {
      timeoutMs: this.o.callTimeoutMs,
      gen: () => (usable(this.link) ? this.link.gen : 0),
      ready: async (signal) => {
        const link = await this.current(signal);
        return { gen: link.gen, open: (s) => this.openSession(link, s.id, s.inboxPrefix) };
      },
      closed: () => (this.closed ? new ClosedError("the host is closed") : undefined),
      messageLimit: (nc) => this.messageLimit(nc),
      watch: () => this.link?.dog,
      revoke: async (id) => {
        await this.callHost("a2a.sessions.close", { contextId: id, keepAgents: true }, AbortSignal.timeout(this.o.callTimeoutMs));
      },
      forget: (s) => this.sessions.delete(s),
    };
  }

  /** A connection with a new credential of session id, over TCP to the url the broker names. */
  private async openSession(link: Link, id: string, inboxPrefix: string): Promise<NatsConnection> {
    const creds: SessionCredentials = await this.request(link.nc, "a2a.host.rpc", "a2a.sessions.open", { contextId: id });
    return connect({
      servers: creds.url,
      user: creds.user,
      pass: creds.password,
      inboxPrefix,
      reconnect: false,
      name: `a2a-bus-node-session`,
      timeout: DIAL_TIMEOUT_MS,
    });
  }

  /** The connection file's content of the broker now joined. */
  connection(): ConnectionInfo | undefined {
    return this.link?.info;
  }

  /**
   * The broker's message limit: the one a sidecar this host started was
   * given, when its args say it; else what the server's payload limit
   * says of it (docs/PROTOCOL.md §11).
   */
  private messageLimit(nc: NatsConnection): number {
    const link = this.link;
    if (this.o.messageLimit !== undefined && link !== undefined && this.owns(link)) return this.o.messageLimit;
    return messageLimitOfPayload(nc.info?.max_payload ?? 0);
  }

  /** The broker's process id while the host is on it; undefined while it is away. */
  pid(): number | undefined {
    return usable(this.link) ? this.link.info.pid : undefined;
  }

  /** Whether the broker the host is on is the sidecar it started (close stops it). */
  started(): boolean {
    return usable(this.link) && this.owns(this.link);
  }

  rejoins(): number {
    return Math.max(this.gen - 1, 0);
  }

  describe(): string {
    return `a2a-bus serve at ${this.link?.info.url ?? "(rejoining)"} (${this.path})`;
  }

  /** Closes every connection; stops the sidecar when it is the host's own (SIGTERM). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.stopping.abort();
    this.link?.dog?.stop();
    await Promise.all([...this.sessions].map((s) => s.close(false)));
    const link = this.link;
    this.link = undefined;
    if (link) await link.nc.close().catch(() => {});
    // A sidecar still starting is killed first: the supervisor may be waiting on it.
    for (const abort of [...this.starting]) abort();
    await this.supervisor;
    const child = this.child;
    if (child && child.exitCode === null && child.signalCode === null) {
      child.kill("SIGTERM");
      const t = setTimeout(() => child.kill("SIGKILL"), 10_000);
      await this.childExited;
      clearTimeout(t);
    }
    if (this.tempDir) await rm(this.tempDir, { recursive: true, force: true }).catch(() => {});
  }
}

/** A link that calls may use: up, and not being dropped. */
function usable(link: Link | undefined): link is Link {
  return link !== undefined && !link.dead && !link.nc.isClosed();
}

/**
 * Resolves once the NATS server at url sends its greeting (INFO) on a new
 * connection, rejects when it has not within ms: the socket is closed
 * either way.
 */
function greets(url: string, ms: number): Promise<void> {
  const u = new URL(url.includes("://") ? url : `nats://${url}`);
  const host = u.hostname.replace(/^\[|\]$/g, "");
  const port = Number(u.port || 4222);
  return new Promise((resolve, reject) => {
    const sock = tcpConnect({ host, port });
    const finish = (err?: Error) => {
      clearTimeout(timer);
      sock.destroy();
      if (err) reject(err);
      else resolve();
    };
    const timer = setTimeout(() => finish(new Error(`the broker at ${url} did not answer within ${ms} ms`)), ms);
    timer.unref();
    sock.once("data", () => finish());
    sock.once("error", (err) => finish(err));
    sock.once("close", () => finish(new Error(`the broker at ${url} closed the connection`)));
  });
}

/**
 * Refuses a connection file a host must not act on (docs/PROTOCOL.md
 * §2.2): a url not on loopback is not the sidecar's embedded server
 * (ForeignBrokerError); a pid that does not run is a stale file, taken
 * for no broker (an Error: start-or-join starts one); a pid that is
 * another user's process is not ours (ForeignBrokerError).
 */
function trusted(info: ConnectionInfo, path: string): void {
  for (const url of info.url.split(",")) {
    let host: string;
    try {
      host = new URL(url.includes("://") ? url.trim() : `nats://${url.trim()}`).hostname;
    } catch {
      throw new ForeignBrokerError(`connection file ${path} has a url that is none (${url}); refused`, path);
    }
    if (!loopback(host)) throw new ForeignBrokerError(`connection file ${path} names a broker at ${url}, not on loopback; refused`, path);
  }
  const pid = info.pid;
  if (!Number.isSafeInteger(pid) || pid <= 0) throw new Error(`connection file ${path} names no process (pid ${pid}): stale`);
  try {
    process.kill(pid, 0);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "EPERM") throw new ForeignBrokerError(`connection file ${path} names pid ${pid}, another user's process; refused`, path);
    if (code === "ESRCH") throw new Error(`connection file ${path} names pid ${pid}, which does not run: stale`);
    throw err;
  }
}

/** Whether host (a URL's hostname) is on loopback: 127.0.0.0/8, ::1, localhost. */
function loopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "").toLowerCase();
  if (h === "localhost") return true;
  if (isIP(h) === 4) return h.startsWith("127.");
  if (isIP(h) === 6) return h === "::1" || h === "0:0:0:0:0:0:0:1";
  return false;
}
