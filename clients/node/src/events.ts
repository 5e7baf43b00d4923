import { ClosedError, SettledError } from "./errors.js";
import type { CallOptions, Resync, State, WaitEvent } from "./runtime.js";
import type { Message, Push, Task, TaskEvent } from "./wire.gen.js";

/**
 * A task the delegate is a member of was created (sent to it), got a
 * message, or changed state.
 */
export interface TaskChangeEvent {
  kind: "created" | "message" | "status";
  taskId: string;
  /** The task's state after the change (`task.status.state`). */
  state: State;
  /** The task after the change, without its history. */
  task: Task;
  /**
   * The change's message: the one that created the task, the one added,
   * or the one its state changed with (an update's message), if any.
   */
  message?: Message;
  /** The task reached a terminal state: no event for it follows. */
  final: boolean;
  /** The notification as the broker sent it (recipient, seq, epoch, …). */
  event: TaskEvent;
  from?: never;
  push?: never;
  resync?: never;
}

/** A oneway message (a push) to the delegate. */
export interface PushEvent {
  kind: "push";
  /** The agentId of the peer that pushed it. */
  from: string;
  message: Message;
  /** The notification as the broker sent it. */
  push: Push;
  taskId?: never;
  state?: never;
  task?: never;
  final?: never;
  event?: never;
  resync?: never;
}

/**
 * The runtime lost track of events for a while and re-read the
 * delegate's tasks: what changed meanwhile, and which of its open tasks
 * the broker no longer has (see Resync).
 */
export interface ResyncEvent {
  kind: "resync";
  resync: Resync;
  taskId?: never;
  state?: never;
  task?: never;
  message?: never;
  final?: never;
  event?: never;
  from?: never;
  push?: never;
}

/** What `Delegate.events()` yields: one of the three, told apart by `kind`. */
export type DelegateEvent = TaskChangeEvent | PushEvent | ResyncEvent;

/** The flat form of what wait returns. */
export function flatten(ev: WaitEvent): DelegateEvent {
  if (ev.task) {
    const e = ev.task;
    return { kind: e.kind, taskId: e.taskId, state: e.task.status.state, task: e.task, ...(e.message ? { message: e.message } : {}), final: e.final, event: e };
  }
  if (ev.push) return { kind: "push", from: ev.push.from, message: ev.push.message, push: ev.push };
  return { kind: "resync", resync: ev.resync };
}

/** Where an EventStream reads: a delegate's wait queue. */
export interface WaitQueue {
  wait(opts: CallOptions): Promise<WaitEvent>;
  /** Puts back, first in line, an event read for a stream that ended meanwhile. */
  giveBack(ev: WaitEvent): void;
}

/**
 * The error a stream throws when its signal aborts, as Node's own
 * iterators (events.on, timers/promises setInterval) do: name
 * "AbortError", code "ABORT_ERR", the signal's reason as its cause.
 */
class AbortError extends Error {
  override name = "AbortError";
  readonly code = "ABORT_ERR";
  constructor(signal: AbortSignal) {
    super("The operation was aborted", { cause: signal.reason });
  }
}

type Result = IteratorResult<DelegateEvent, undefined>;
const DONE: Result = { done: true, value: undefined };

/**
 * A delegate's events as an async iterator, read from the queue wait
 * reads. It returns when the delegate settles or its session or host
 * closes, throws an AbortError when its signal aborts, and anything else
 * that stops wait (a RefusedError) it throws. Its reads are one at a
 * time, in order. Ended by return (a `break` out of `for await`), a read
 * in progress ends and takes no event: an event it had already taken is
 * put back for the next reader.
 */
export class EventStream implements AsyncIterableIterator<DelegateEvent> {
  private readonly stop = new AbortController();
  private ended = false;
  private last: Promise<unknown> = Promise.resolve();
  private readonly onAbort = () => this.stop.abort(this.signal?.reason);

  constructor(
    private readonly source: WaitQueue,
    private readonly signal?: AbortSignal,
  ) {
    signal?.addEventListener("abort", this.onAbort, { once: true });
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  next(): Promise<Result> {
    const p = this.last.then(() => this.read());
    this.last = p.catch(() => {});
    return p;
  }

  return(): Promise<Result> {
    this.end();
    return Promise.resolve(DONE);
  }

  private async read(): Promise<Result> {
    if (this.ended) return DONE;
    if (this.signal?.aborted) {
      this.end();
      throw new AbortError(this.signal);
    }
    let ev: WaitEvent;
    try {
      ev = await this.source.wait({ signal: this.stop.signal });
    } catch (err) {
      if (this.ended) return DONE; // return was called meanwhile
      this.end();
      if (this.signal?.aborted) throw new AbortError(this.signal);
      if (err instanceof SettledError || err instanceof ClosedError) return DONE;
      throw err;
    }
    if (this.ended) {
      this.source.giveBack(ev);
      return DONE;
    }
    return { done: false, value: flatten(ev) };
  }

  private end(): void {
    if (this.ended) return;
    this.ended = true;
    this.signal?.removeEventListener("abort", this.onAbort);
    this.stop.abort(new ClosedError("the event stream ended"));
  }
}
