import { A2ABusError } from "./errors.js";
import { Queue } from "./util.js";

/** A notification as the broker sends it (docs/PROTOCOL.md §5). */
export interface Notification {
  jsonrpc?: "2.0";
  method: string;
  params: {
    recipient: string;
    recipientContextId?: string;
    contextId?: string;
    seq: number;
    epoch: string;
    [k: string]: unknown;
  };
}

/** Where logs go; console fits. The default drops them. */
export interface Logger {
  debug(msg: string, ...rest: unknown[]): void;
  info(msg: string, ...rest: unknown[]): void;
  warn(msg: string, ...rest: unknown[]): void;
  error(msg: string, ...rest: unknown[]): void;
}

export const quiet: Logger = { debug() {}, info() {}, warn() {}, error() {} };

/** How many notifications a subscription holds for a reader that lags. */
export const SUBSCRIPTION_QUEUE = 8192;

/**
 * One session's notifications as they arrive. The queue ends when the
 * subscription is lost (the connection broke, the broker restarted):
 * subscribe again and replay. `queue.dropped` counts what a reader that
 * fell behind lost.
 */
export interface Subscription {
  readonly queue: Queue<Notification>;
  close(): void;
}

/** One session's side of a bus: its calls and its notifications. */
export interface SessionLink {
  readonly id: string;
  /**
   * One JSON-RPC call on the session. Rejects with A2ABusError for an
   * error answer, UnavailableError when the answer was lost, ClosedError
   * once the session or the bus is closed.
   */
  call(method: string, params: object, signal?: AbortSignal): Promise<any>;
  subscribe(signal?: AbortSignal): Promise<Subscription>;
  /** Ends the session's link; with revoke (NATS), a2a.sessions.close too. */
  close(revoke?: boolean): Promise<void>;
}

/** A host's connection to the broker, whichever bus carries it. */
export interface Bus {
  readonly kind: "nats" | "pipe";
  session(id: string): SessionLink;
  /** A host-only call (a2a.sessions.*, a2a.admin.*). */
  callHost(method: string, params: object, signal?: AbortSignal): Promise<any>;
  /** The broker's process id while the host is on it; undefined while it is away. */
  pid(): number | undefined;
  /** Whether the broker the host is on is one it started (close stops it). */
  started(): boolean;
  /** How many times the host reached a new broker after losing one. */
  rejoins(): number;
  describe(): string;
  close(): Promise<void>;
}

/** A notification's session: recipientContextId, else contextId (rule 5). */
export function sessionOf(n: Notification): string | undefined {
  return n.params?.recipientContextId || n.params?.contextId;
}

/** Parses a JSON-RPC response body into its result, or throws its error as an A2ABusError. */
export function resultOf(method: string, body: unknown): any {
  const r = body as { result?: unknown; error?: { code: number; message: string; data?: any } };
  if (r && typeof r === "object" && r.error) throw new A2ABusError(method, r.error);
  return r?.result;
}
