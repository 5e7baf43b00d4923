export { Host, type HostOptions } from "./host.js";
export type { PageCredentials } from "./browser.js";
export { DEFAULT_HEALTH_TIMEOUT_MS } from "./health.js";
export { brokerBinary } from "./binary.js";
export { DEFAULT_CALL_TIMEOUT_MS } from "./deadline.js";
export type { HostEvents, BrokerExitEvent, RejoinedEvent, ResyncEvent as HostResyncEvent, RenamedEvent, LostEvent } from "./host-events.js";
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
  ForeignBrokerError,
  Codes,
  isCode,
  type Code,
} from "./errors.js";
export { Feed, DEFAULT_CHECK_MS, DEFAULT_RETRY_MS, type Gap, type FeedItem } from "./feed.js";
export { readConnectionFile, defaultConnectionFile, defaultStateDir, type ConnectionInfo } from "./connfile.js";
export { subjectToken } from "./util.js";
export type { Logger, Notification } from "./bus.js";
export type { DelegateEvent, TaskChangeEvent, PushEvent, ResyncEvent } from "./events.js";
export type { HostMethod, HostCallArgs, ParamsOf, ResultOf } from "./methods.js";
// The wire types a user of the package meets; the rest (each method's
// params, Error, the File behind a file part) stay inside it.
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
  AdminInfo,
  AdminAgents,
  AdminSessions,
  AdminSession,
  AdminTasks,
  AdminTask,
  PageParams,
  SessionParams,
  SessionCloseParams,
  SessionCloseResult,
  SessionCredentials,
  Methods,
  Notifications,
} from "./wire.gen.js";
