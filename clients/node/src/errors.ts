import type { ErrorData } from "./wire.gen.js";

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
 * The NATS server refused the session's subscription to its events (a
 * credential for another session, or an operator's permissions or cap on
 * an external server): asking again gets the same answer.
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
