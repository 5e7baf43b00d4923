import type { ErrorData } from "./wire.gen.js";

/**
 * A signal's name, as Node reports a child's exit: NodeJS.Signals, spelled
 * out so that these declarations need no Node types (the browser entry
 * shares them).
 */
export type SignalName =
  | "SIGABRT"
  | "SIGALRM"
  | "SIGBUS"
  | "SIGCHLD"
  | "SIGCONT"
  | "SIGFPE"
  | "SIGHUP"
  | "SIGILL"
  | "SIGINT"
  | "SIGIO"
  | "SIGIOT"
  | "SIGKILL"
  | "SIGPIPE"
  | "SIGPOLL"
  | "SIGPROF"
  | "SIGPWR"
  | "SIGQUIT"
  | "SIGSEGV"
  | "SIGSTKFLT"
  | "SIGSTOP"
  | "SIGSYS"
  | "SIGTERM"
  | "SIGTRAP"
  | "SIGTSTP"
  | "SIGTTIN"
  | "SIGTTOU"
  | "SIGUNUSED"
  | "SIGURG"
  | "SIGUSR1"
  | "SIGUSR2"
  | "SIGVTALRM"
  | "SIGWINCH"
  | "SIGXCPU"
  | "SIGXFSZ"
  | "SIGBREAK"
  | "SIGLOST"
  | "SIGINFO";

/** The stable codes of docs/PROTOCOL.md §6: `error.data.code` → `error.code`. */
export const Codes = {
  A2A_UNKNOWN_TASK: -32001,
  A2A_UNKNOWN_AGENT: -32040,
  A2A_NO_PEERS: -32041,
  A2A_AMBIGUOUS_PEER: -32042,
  A2A_CROSS_CONTEXT_DENIED: -32043,
  A2A_TASK_LIMIT: -32044,
  A2A_UNAUTHORIZED: -32045,
  A2A_INVALID_TRANSITION: -32046,
  A2A_REPLAY_GAP: -32047,
  A2A_AGENT_LIMIT: -32048,
  A2A_BUSY: -32049,
  PARSE_ERROR: -32700,
  INVALID_REQUEST: -32600,
  METHOD_NOT_FOUND: -32601,
  INVALID_PARAMS: -32602,
  INTERNAL_ERROR: -32603,
} as const;

/** One of the stable string codes. */
export type Code = keyof typeof Codes;

const byNumber = new Map<number, Code>(Object.entries(Codes).map(([k, v]) => [v, k as Code]));

/**
 * An error the broker answered: `code` is the stable string
 * (`A2A_TASK_LIMIT`), `rpcCode` the JSON-RPC number, `data` the error's
 * data (`candidates` for A2A_AMBIGUOUS_PEER, `epoch` and `oldestSeq` for
 * A2A_REPLAY_GAP).
 */
export class A2ABusError extends Error {
  override name = "A2ABusError";
  readonly code: Code | string;
  readonly rpcCode: number;
  readonly data?: ErrorData;
  readonly method: string;

  constructor(method: string, err: { code: number; message: string; data?: ErrorData }) {
    super(`${method}: ${err.message}`);
    this.method = method;
    this.rpcCode = err.code;
    this.data = err.data;
    this.code = err.data?.code ?? byNumber.get(err.code) ?? String(err.code);
  }

  /** The sorted candidates of an A2A_AMBIGUOUS_PEER, else []. */
  get candidates(): string[] {
    return this.data?.candidates ?? [];
  }
}

/**
 * The answer to a call was lost: the broker could not be reached, the
 * connection broke, or the call timed out. A change may or may not have
 * been applied; retried with the same messageId it is applied once
 * (docs/PROTOCOL.md §4.11). The runtime retries changes itself.
 */
export class UnavailableError extends Error {
  override name = "UnavailableError";
}

/** The host, or the session, was closed. */
export class ClosedError extends Error {
  override name = "ClosedError";
}

/**
 * Refused, and asking again gets the same answer: the NATS server refused
 * the session's subscription to its events (a credential for another
 * session, or an operator's permissions or cap on an external server);
 * or a page's credential was asked of a broker with no WebSocket listener
 * (Host.sessionCredentials).
 */
export class RefusedError extends Error {
  override name = "RefusedError";
}

/** The delegate has settled (deregistered): its handle no longer acts. */
export class SettledError extends Error {
  override name = "SettledError";
  constructor() {
    super("the delegate has settled");
  }
}

/** True when err is a broker error with the given stable code. */
export function isCode(err: unknown, code: Code): boolean {
  return err instanceof A2ABusError && err.code === code;
}

/**
 * The broker's -32600 (INVALID_REQUEST), for a request refused before it
 * is sent because the broker would refuse it without its id.
 */
export function invalidRequest(method: string, message: string): A2ABusError {
  return new A2ABusError(method, { code: Codes.INVALID_REQUEST, message, data: { code: "INVALID_REQUEST" } });
}

/** The error a request over the message limit gets. */
export function tooLarge(method: string, size: number, limit: number): A2ABusError {
  return invalidRequest(method, `the request is ${size} bytes, over the message limit of ${limit} bytes`);
}

/**
 * The broker could not be started (`code` "BROKER_START_FAILED"). When
 * the binary did not run at all, `cause` is the spawn's error (its `code`
 * is ENOENT for no such binary, EACCES for one that is not executable);
 * when it ran and exited before it was ready, `exitCode` or `signal` say
 * how, and `output` holds its last lines on stderr (empty when it printed
 * nothing).
 */
export class BrokerStartError extends Error {
  override name = "BrokerStartError";
  readonly code: "BROKER_START_FAILED" | "BROKER_RUNNING" = "BROKER_START_FAILED";
  /** Its exit status, when it exited. */
  readonly exitCode?: number | null;
  /** The signal that ended it, when one did. */
  readonly signal?: SignalName | null;
  /** Its last lines on stderr (at most four). */
  readonly output: string[];

  constructor(message: string, o: { cause?: unknown; exitCode?: number | null; signal?: SignalName | null; output?: string[] } = {}) {
    super(message, o.cause === undefined ? undefined : { cause: o.cause });
    this.exitCode = o.exitCode;
    this.signal = o.signal;
    this.output = o.output ?? [];
  }
}

/**
 * The broker could not be started because another one runs (`code`
 * "BROKER_RUNNING"): at the connection file (`connectionFile`, and the
 * running broker's `pid` when its file says it), which a host joins
 * instead, or on the data dir (`dataDir` true), whose broker a host cannot
 * find from it. A BrokerStartError too.
 */
export class BrokerRunningError extends BrokerStartError {
  override name = "BrokerRunningError";
  override readonly code = "BROKER_RUNNING" as const;
  /** The running broker's connection file, when it is the connection file that is taken. */
  readonly connectionFile?: string;
  /** The running broker's process id, when its connection file says it. */
  readonly pid?: number;
  /** True when it is the data dir that another broker holds. */
  readonly dataDir: boolean;

  constructor(
    message: string,
    o: { cause?: unknown; exitCode?: number | null; signal?: SignalName | null; output?: string[]; connectionFile?: string; pid?: number; dataDir?: boolean } = {},
  ) {
    super(message, o);
    this.connectionFile = o.connectionFile;
    this.pid = o.pid;
    this.dataDir = o.dataDir ?? false;
  }
}

/**
 * The connection file names a broker this host must not trust (`code`
 * "BROKER_FOREIGN"): its url is not on loopback (127.0.0.0/8, ::1,
 * localhost), or its pid is another user's process. The host neither
 * joins it nor starts a broker in its place.
 */
export class ForeignBrokerError extends Error {
  override name = "ForeignBrokerError";
  readonly code = "BROKER_FOREIGN" as const;
  /** The connection file that was refused. */
  readonly connectionFile: string;

  constructor(message: string, connectionFile: string) {
    super(message);
    this.connectionFile = connectionFile;
  }
}
