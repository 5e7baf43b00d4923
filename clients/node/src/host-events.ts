import type { SignalName } from "./errors.js";

/**
 * What a Host emits (it is an EventEmitter): `host.on("brokerExit", (ev)
 * => ...)`. Listeners are called synchronously, in the host's own
 * bookkeeping; one that throws does not disturb it (its error is thrown
 * again on the next tick, as an uncaught exception).
 */
export interface HostEvents {
  /** The broker this host was on is gone: its process exited, or its connection was lost or dropped. */
  brokerExit: [ev: BrokerExitEvent];
  /** The host is on a broker again after losing one: restarted, started anew, or joined. */
  rejoined: [ev: RejoinedEvent];
  /** A session's delegates lost track of their events (the broker restarted, events were lost beyond replay) and resync. */
  resync: [ev: ResyncEvent];
  /** A delegate registered again (after a restart) got another agentId than it had. */
  renamed: [ev: RenamedEvent];
  /** A delegate's resync found tasks it knew as open that the broker no longer has. */
  lost: [ev: LostEvent];
}

export interface BrokerExitEvent {
  /** The broker's process id, when known. */
  pid?: number;
  /** True when this host started it (and so starts one again). */
  started: boolean;
  /** Its exit status, when this host started it and saw it exit. */
  code?: number | null;
  /** The signal that ended it, when this host started it and saw it exit. */
  signal?: SignalName | null;
  /** What happened, in words: "the broker exited (SIGKILL)", "the connection to the broker closed", "it did not answer ...". */
  reason: string;
}

export interface RejoinedEvent {
  /** The new broker's process id. */
  pid?: number;
  /** True when this host started it. */
  started: boolean;
  /** host.describe() on the new broker. */
  description: string;
  /** How many times the host has reached a new broker after losing one (host.rejoins). */
  rejoins: number;
}

export interface ResyncEvent {
  /** The session whose delegates resync. */
  sessionId: string;
  /** Why: "the broker restarted", "events were lost beyond the replay window", ... */
  reason: string;
  /** True when the broker restarted: the delegates were registered again. */
  brokerRestarted: boolean;
}

export interface RenamedEvent {
  sessionId: string;
  /** The delegate's stable instance id. */
  instanceId: string;
  /** Its agentId before. */
  from: string;
  /** Its agentId now (delegate.id). */
  to: string;
}

export interface LostEvent {
  sessionId: string;
  /** The delegate's agentId. */
  delegateId: string;
  /** The tasks lost, as its resync's `lost` (in id order). */
  taskIds: string[];
}

/** @internal How the parts of a host tell it what to emit. */
export type Tell = <K extends keyof HostEvents>(name: K, ev: HostEvents[K][0]) => void;

/** @internal Tells nothing. */
export const tellNothing: Tell = () => {};
