// @a2a-bus/host/browser: a chat session's runtime for a page (an Electron
// renderer), over the broker's WebSocket listener, with the credential
// its host hands it. Nothing here, nor in what it imports, is Node's.
import { wsconnect, type NatsConnection } from "@nats-io/nats-core";

import { quiet, type Logger } from "./bus.js";
import { DEFAULT_CALL_TIMEOUT_MS, withDeadline } from "./deadline.js";
import { messageLimitOfPayload, NatsSessionLink, type SessionSource } from "./natslink.js";
import { Session, type Retry } from "./runtime.js";
import { checkSessionId, positive } from "./util.js";

/**
 * A session's credential for a page (a2a.sessions.open's result, with
 * the WebSocket listener's url): what Host.sessionCredentials gives.
 */
export interface PageCredentials {
  /** The broker's WebSocket url (`ws://127.0.0.1:PORT`): the one a page connects to. */
  wsUrl: string;
  user: string;
  password: string;
  /** The broker's NATS url over TCP, for a client that is no page; not used here. */
  url?: string;
}

export interface ConnectSessionOptions {
  /** The session (its contextId): 1 to 256 bytes of UTF-8 without control characters. */
  contextId: string;
  /**
   * Gets a new credential of the session from the host (an Electron app's
   * main process: `host.sessionCredentials(contextId)`, through its
   * preload bridge). Called for the first connection, and again each time
   * the connection must be made again (the broker restarted, the
   * credential was revoked): a page never makes its own. While it rejects,
   * or its credential does not connect, it is called again with backoff,
   * within callTimeoutMs; a TypeError (no credential at all) is final.
   */
  credentials: (contextId: string) => Promise<PageCredentials> | PageCredentials;
  /** About how often a waiting delegate's session checks for an event lost with no signal (ms, default 30 000). */
  checkMs?: number;
  /** How a change whose answer was lost is tried again; what is left out (or not positive) is the default's. */
  retry?: Partial<Retry>;
  /** How many events a delegate's wait queue holds (default 4 096). */
  queue?: number;
  /**
   * How long a call may take in all (ms, default 10 000), its retries and
   * its waits for a connection included; so may connectSession itself.
   */
  callTimeoutMs?: number;
  /** Where logs go (console fits); the default drops them. */
  logger?: Logger;
  /** Ends connectSession sooner. */
  signal?: AbortSignal;
}

/** How long a dial may take, the server's greeting included. */
const DIAL_TIMEOUT_MS = 2000;

/**
 * The NATS binding's client pings (docs/PROTOCOL.md §2.2): every 30 s,
 * 2 unanswered allowed, so that a broker that hangs is noticed.
 */
const PING_INTERVAL_MS = 30_000;
const MAX_PINGS_OUT = 2;

/**
 * Connects a chat session's runtime over the broker's WebSocket listener,
 * with the credentials the host hands the page: the same Session as a
 * Node host's `host.session(contextId)`, with the same guarantees (its
 * delegates' changes retried with their idempotency keys, its events
 * replayed after a gap, a resync after a broker restart, its delegates
 * registered again).
 *
 * ```js
 * import { connectSession, text } from "@a2a-bus/host/browser";
 * const chat = await connectSession({ contextId: "chat-1", credentials: (id) => window.bridge.a2aCredentials(id) });
 * const d = await chat.spawn({ name: "discussant" });
 * ```
 *
 * Closing the session (close or leave) closes its connection; its
 * credential is revoked only by the host (a2a.sessions.close), or by a
 * broker restart.
 */
export async function connectSession(o: ConnectSessionOptions): Promise<Session> {
  checkSessionId("connectSession", o?.contextId);
  if (typeof o.credentials !== "function") throw new TypeError("connectSession: credentials must be a function that gets the session's credentials from the host");
  const callTimeoutMs = positive(o.callTimeoutMs, DEFAULT_CALL_TIMEOUT_MS);
  const logger = o.logger ?? quiet;
  const link = new NatsSessionLink(o.contextId, pageSource(o.credentials, callTimeoutMs));
  try {
    return await withDeadline(callTimeoutMs, `session ${o.contextId}`, o.signal, (signal) =>
      Session.open(link, { checkMs: o.checkMs, retry: o.retry, queue: o.queue, callTimeoutMs, logger }, signal),
    );
  } catch (err) {
    await link.close(false);
    throw err;
  }
}

/**
 * Where a page's session link gets its connections: each a WebSocket
 * connection with a credential the callback gets. A connection is good
 * while it is open (generation 1 throughout); one that closed is made
 * again with a new credential.
 */
function pageSource(credentials: ConnectSessionOptions["credentials"], timeoutMs: number): SessionSource {
  const open = async (s: { id: string; inboxPrefix: string }): Promise<NatsConnection> => {
    const c = await credentials(s.id);
    if (!c || typeof c !== "object") throw new TypeError(`session ${s.id}: the credentials callback gave no credentials (${c === null ? "null" : typeof c})`);
    if (typeof c.wsUrl !== "string" || c.wsUrl === "") {
      throw new TypeError(`session ${s.id}: the credentials have no wsUrl: the broker has no WebSocket listener (serve --ws-listen)`);
    }
    return wsconnect({
      servers: c.wsUrl,
      user: c.user,
      pass: c.password,
      inboxPrefix: s.inboxPrefix,
      reconnect: false,
      name: "a2a-bus-page-session",
      timeout: DIAL_TIMEOUT_MS,
      pingInterval: PING_INTERVAL_MS,
      maxPingOut: MAX_PINGS_OUT,
    });
  };
  return {
    timeoutMs,
    gen: () => 1,
    ready: async () => ({ gen: 1, open }),
    closed: () => undefined, // the link says when it is closed itself
    messageLimit: (nc) => messageLimitOfPayload(nc.info?.max_payload ?? 0),
    watch: () => undefined,
  };
}

export { Session, Delegate, text, DEFAULT_RETRY, DEFAULT_QUEUE } from "./runtime.js";
export type {
  WaitEvent,
  Resync,
  Retry,
  State,
  UpdateState,
  MessageInput,
  CardInput,
  CallOptions,
  SendOptions,
  UpdateOptions,
  ListOptions,
  SpawnOptions,
} from "./runtime.js";
export { DEFAULT_CALL_TIMEOUT_MS } from "./deadline.js";
export { DEFAULT_CHECK_MS } from "./feed.js";
export { A2ABusError, UnavailableError, ClosedError, RefusedError, SettledError, Codes, isCode, type Code } from "./errors.js";
export { subjectToken } from "./util.js";
export type { Logger, Notification } from "./bus.js";
export type { DelegateEvent, TaskChangeEvent, PushEvent, ResyncEvent } from "./events.js";
export type {
  AgentCard,
  Skill,
  Message,
  Part,
  TextPart,
  DataPart,
  FilePart,
  FileWithBytes,
  FileWithUri,
  Artifact,
  Task,
  TaskStatus,
  TaskEvent,
  Push,
  ErrorData,
} from "./wire.gen.js";
