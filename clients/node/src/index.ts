export { Host, type HostOptions } from "./host.js";
export { DEFAULT_HEALTH_TIMEOUT_MS } from "./health.js";
export { DEFAULT_CALL_TIMEOUT_MS } from "./deadline.js";
export type { HostEvents, BrokerExitEvent, RejoinedEvent, ResyncEvent, RenamedEvent, LostEvent } from "./host-events.js";
export {
  Session,
  Delegate,
  text,
  DEFAULT_RETRY,
  DEFAULT_QUEUE,
  type WaitEvent,
  type Resync,
  type Retry,
  type State,
  type UpdateState,
  type MessageInput,
  type CardInput,
  type CallOptions,
  type SendOptions,
  type UpdateOptions,
  type ListOptions,
  type SpawnOptions,
} from "./runtime.js";
export {
  A2ABusError,
  UnavailableError,
  ClosedError,
  RefusedError,
  SettledError,
  BrokerStartError,
  BrokerRunningError,
  Codes,
  isCode,
  type Code,
} from "./errors.js";
export { Feed, DEFAULT_CHECK_MS, DEFAULT_RETRY_MS, type Gap, type FeedItem } from "./feed.js";
export { readConnectionFile, defaultConnectionFile, defaultStateDir, type ConnectionInfo } from "./connfile.js";
export { subjectToken } from "./util.js";
export type { Logger, Notification } from "./bus.js";
export type * from "./wire.gen.js";
