import { ClosedError, RefusedError, SettledError, UnavailableError, isCode } from "./errors.js";
import type { Logger, SessionLink } from "./bus.js";
import { DEFAULT_CALL_TIMEOUT_MS, withDeadline } from "./deadline.js";
import { tellNothing, type Tell } from "./host-events.js";
import { DEFAULT_CHECK_MS, Feed, type Gap } from "./feed.js";
import { EventStream, type DelegateEvent } from "./events.js";
import { Mutex, positive, sleep, uuid, type Timer } from "./util.js";
import type {
  AgentCard,
  Artifact,
  ListAgentsResult,
  ListTasksResult,
  Message,
  Push,
  RegisterResult,
  SendResult,
  Task,
  TaskEvent,
  TaskResult,
  TaskStatus,
} from "./wire.gen.js";

/** A task's state. */
export type State = TaskStatus["state"];
/** The states an assignee may set. */
export type UpdateState = Exclude<State, "submitted" | "canceled">;

/** A message as a delegate writes it: the broker fills in the rest. */
export type MessageInput = Omit<Message, "messageId"> & { messageId?: string };

/** A message of one text part. */
export function text(s: string): MessageInput {
  return { parts: [{ kind: "text", text: s }] };
}

/** The card a delegate registers: a name, and what else it says of itself. */
export type CardInput = Omit<AgentCard, "agentId" | "contextId" | "registeredAt">;

/**
 * What wait returns: exactly one of task, push and resync.
 * - task: a task the delegate is a member of was created, got a message, or changed state;
 * - push: a oneway message to it;
 * - resync: the runtime lost track of events for a while (the broker
 *   restarted, events were lost beyond replay, the wait queue overflowed)
 *   and re-read the delegate's tasks: what changed, and which of its open
 *   tasks the broker no longer has.
 */
export type WaitEvent = { task: TaskEvent; push?: never; resync?: never } | { push: Push; task?: never; resync?: never } | { resync: Resync; task?: never; push?: never };

/** What a delegate sees after a break: the tasks that changed meanwhile, read fresh, and the open ones that are gone. */
export interface Resync {
  reason: string;
  /**
   * Its tasks that changed since it last heard of them, or that it did
   * not know: compare their status with what it was waiting for. Pushes
   * sent meanwhile may be lost; tasks the broker keeps are not (lost
   * names those it does not).
   */
  changed: Task[];
  /**
   * In id order, the ids of tasks the delegate knew as open (the last it
   * heard of them, from a call's result, an event, a read or an earlier
   * resync, they were not terminal) that the broker no longer has: it
   * restarted without a durable store (dataDir ""), or the task ended and
   * was pruned before the delegate heard how. No event will come for them
   * and calls on them fail with A2A_UNKNOWN_TASK: stop waiting, and send
   * the work again if it is still wanted. Each id is confirmed by reading
   * the task (a list that missed a live task never makes it lost; a read
   * that fails otherwise leaves it for the next resync) and reported
   * once. A task last seen terminal that is gone is not lost: its outcome
   * was told.
   */
  lost: string[];
  /** Its previous agentId when registering again gave it a new one. */
  renamedFrom?: string;
}

/** How a change whose answer was lost is tried again (docs/PROTOCOL.md §4.11). */
export interface Retry {
  attempts: number;
  backoffMs: number;
  maxBackoffMs: number;
}

/** Six attempts over about six seconds: longer than a sidecar takes to restart. */
export const DEFAULT_RETRY: Retry = { attempts: 6, backoffMs: 200, maxBackoffMs: 2000 };
/** How many events a delegate's wait queue holds; past it, a resync. */
export const DEFAULT_QUEUE = 4096;

export interface SessionOptions {
  /** About how often a waiting feed checks for an event lost with no signal (ms). */
  checkMs?: number;
  queue?: number;
  retry?: Partial<Retry>;
  /** How long each call may take in all, its retries and waits included (ms). */
  callTimeoutMs?: number;
  logger: Logger;
  /** Called once the session has closed or left. */
  onEnd?: (s: Session) => void;
  /** @internal Where the session tells its host of resyncs, renames and lost tasks. */
  tell?: Tell;
}

export interface CallOptions {
  signal?: AbortSignal;
}

export interface SendOptions extends CallOptions {
  /** Kept with the task (the creating send's metadata). */
  metadata?: Record<string, unknown>;
}

export interface UpdateOptions extends CallOptions {
  message?: MessageInput;
  artifacts?: Array<Omit<Artifact, "artifactId"> & { artifactId?: string }>;
}

export interface ListOptions extends CallOptions {
  state?: State;
  role?: "requester" | "assignee";
}

export interface SpawnOptions extends CallOptions {
  /** The delegate's stable id: spawning it again (after a restart) takes its tasks back. */
  instanceId?: string;
}

const SETTLE_TIMEOUT_MS = 5000;
const RESYNC_RETRY_MS = 200;

/** The states a task never leaves. */
const TERMINAL = new Set<string | undefined>(["completed", "failed", "canceled", "rejected"]);

/** What a delegate has been told of one task. */
interface Known {
  /** Its updatedAt. */
  at: string;
  /** It was not terminal. */
  open: boolean;
  /** Delegate.resyncs when it was told: which resyncs' lists follow. */
  gen: number;
}

/** Orders strings by their code units, as Go orders ids by their bytes (the same for ASCII ids). */
function byCodeUnits(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/**
 * One chat session's A2A runtime: what the session's parent uses to
 * spawn delegates. The parent has no A2A handle of its own (nothing here
 * sends a message), and a Delegate has no spawn: no nested delegation.
 */
export class Session {
  private feed!: Feed;
  private readonly stop = new AbortController();
  private pumped?: Promise<void>;
  /** @internal held while a delegate registers; the pump waits on it to route. */
  readonly naming = new Mutex();
  private byId = new Map<string, Delegate>();
  private live = new Set<Delegate>();
  private closed = false;
  private ended?: Promise<void>;
  /** @internal */
  waiting = 0;
  /** @internal */
  readonly opts: { queue: number; retry: Retry; callTimeoutMs: number; logger: Logger; checkMs: number; onEnd?: (s: Session) => void; tell: Tell };

  private constructor(
    /** @internal */ readonly link: SessionLink,
    o: SessionOptions,
  ) {
    const r = o.retry ?? {};
    this.opts = {
      queue: positive(o.queue, DEFAULT_QUEUE),
      retry: {
        attempts: Math.floor(positive(r.attempts, DEFAULT_RETRY.attempts)),
        backoffMs: positive(r.backoffMs, DEFAULT_RETRY.backoffMs),
        maxBackoffMs: positive(r.maxBackoffMs, DEFAULT_RETRY.maxBackoffMs),
      },
      callTimeoutMs: positive(o.callTimeoutMs, DEFAULT_CALL_TIMEOUT_MS),
      logger: o.logger,
      checkMs: positive(o.checkMs, DEFAULT_CHECK_MS),
      onEnd: o.onEnd,
      tell: o.tell ?? tellNothing,
    };
  }

  /** @internal */
  static async open(link: SessionLink, o: SessionOptions, signal?: AbortSignal): Promise<Session> {
    const s = new Session(link, o);
    s.feed = await Feed.open(link, { checkMs: s.opts.checkMs, shouldCheck: () => s.waiting > 0, logger: o.logger }, signal);
    s.pumped = s.pump();
    return s;
  }

  /** The session's id (its contextId). */
  get id(): string {
    return this.link.id;
  }

  /** The live delegates. */
  delegates(): Delegate[] {
    return [...this.live];
  }

  /** Hands each event to its recipient's wait queue; turns a break into a resync. */
  private async pump(): Promise<void> {
    const signal = this.stop.signal;
    for (;;) {
      let item;
      try {
        item = await this.feed.next(signal);
      } catch (err) {
        if (!signal.aborted) {
          if (err instanceof ClosedError) this.opts.logger.debug(`the session's feed ended: ${err.message}`);
          else this.opts.logger.warn(`the session's feed ended: ${(err as Error).message}`);
          for (const d of this.live) d.fail(err instanceof ClosedError || err instanceof RefusedError ? err : new ClosedError(String(err)));
        }
        return;
      }
      if (item.gap) {
        await this.resync(item.gap);
        continue;
      }
      const route = () => this.byId.get(item.event.params.recipient);
      // An event for a delegate being named waits for the name.
      const d = this.naming.idle ? route() : await this.naming.run(async () => route());
      if (d) {
        const ev: WaitEvent = item.event.method === "a2a.push" ? { push: item.event.params as unknown as Push } : { task: item.event.params as unknown as TaskEvent };
        d.deliver(ev);
      } else {
        this.opts.logger.debug(`event for no delegate of this session: ${item.event.params.recipient}`);
      }
    }
  }

  private async resync(gap: Gap): Promise<void> {
    this.opts.logger.info(`resyncing the session's delegates: ${gap.reason}`);
    this.opts.tell("resync", { sessionId: this.id, reason: gap.reason, brokerRestarted: gap.newEpoch });
    for (const d of this.live) {
      if (gap.newEpoch) {
        // At once, so that peers can address it again; if this fails its next call does it.
        try {
          await d.register(this.stop.signal);
        } catch (err) {
          this.opts.logger.warn(`re-registering ${d.id} failed; it will retry: ${(err as Error).message}`);
        }
      }
      d.needResync(gap.reason);
    }
  }

  /**
   * Registers a delegate from its card. Names are unique on the host
   * (discussant, then discussant-2): the delegate adopts the assigned id,
   * which `id` and `prompt` tell it.
   */
  async spawn(card: CardInput, opts: SpawnOptions = {}): Promise<Delegate> {
    if (this.closed) throw new ClosedError(`session ${this.id} is closed`);
    const d = Delegate.create(this, opts.instanceId ?? uuid(), card);
    // Registering again under the same instance id replaces the
    // registration: safe to retry when its answer is lost.
    await this.bounded("a2a.agents.register", opts.signal, (signal) =>
      this.naming.run(async () => {
        // Past close's barrier the link may be gone: do not register.
        if (this.closed) throw new ClosedError(`session ${this.id} is closed`);
        await this.retry(signal, () => d.registerLocked(signal));
      }),
    );
    return d;
  }

  /** @internal makes a newly registered delegate routable; false once the session is closed. */
  admit(d: Delegate): boolean {
    if (this.closed) return false;
    this.live.add(d);
    this.byId.set(d.id, d);
    return true;
  }

  /** @internal */
  rename(d: Delegate, oldId: string, newId: string): void {
    if (this.byId.get(oldId) === d) this.byId.delete(oldId);
    if (this.live.has(d)) this.byId.set(newId, d);
  }

  /** @internal */
  forget(d: Delegate): void {
    this.live.delete(d);
    if (this.byId.get(d.id) === d) this.byId.delete(d.id);
  }

  /**
   * Settles every live delegate (deregistering it: peers see its open
   * tasks end), stops the feed and closes the session: on NATS the
   * broker revokes its credential. Idempotent.
   */
  close(): Promise<void> {
    return this.end(true);
  }

  /**
   * Closes like close, but leaves the delegates registered: their tasks
   * stay open, and spawning the same instance ids again takes them back.
   */
  leave(): Promise<void> {
    return this.end(false);
  }

  private async end(settle: boolean): Promise<void> {
    if (this.closed) return this.ended;
    this.closed = true;
    this.ended = this.finish(settle);
    return this.ended;
  }

  private async finish(settle: boolean): Promise<void> {
    // A spawn registering now sees the session closed and takes its
    // registration back while the link is still open.
    await this.naming.run(async () => {});
    if (settle) {
      const signal = AbortSignal.timeout(SETTLE_TIMEOUT_MS);
      await Promise.all(
        [...this.live].map((d) =>
          d.settle({ signal }).catch((err) => {
            if (!(err instanceof SettledError)) this.opts.logger.debug(`settling ${d.id} at close failed: ${(err as Error).message}`);
          }),
        ),
      );
    }
    this.stop.abort(new ClosedError(`session ${this.id} is closed`));
    await this.pumped;
    this.feed.close();
    const gone = new ClosedError(`session ${this.id} is closed`);
    for (const d of this.live) d.fail(gone);
    await this.link.close(settle);
    this.opts.onEnd?.(this);
  }

  /**
   * @internal Runs one call of the caller's within callTimeoutMs, all its
   * attempts and waits included: past it, UnavailableError; the caller's
   * signal ends it sooner.
   */
  bounded<T>(what: string, signal: AbortSignal | undefined, call: (signal: AbortSignal) => Promise<T>): Promise<T> {
    return withDeadline(this.opts.callTimeoutMs, what, signal, call);
  }

  /** @internal Runs a change until it is answered, fails otherwise, or its attempts (or its signal) are spent. */
  async retry<T>(signal: AbortSignal | undefined, change: () => Promise<T>): Promise<T> {
    const r = this.opts.retry;
    let wait = r.backoffMs;
    for (let attempt = 1; ; attempt++) {
      try {
        return await change();
      } catch (err) {
        if (!(err instanceof UnavailableError) || attempt >= r.attempts || this.closed || signal?.aborted) throw err;
        this.opts.logger.debug(`answer lost; trying again (attempt ${attempt}): ${err.message}`);
        await sleep(wait, signal);
        wait = Math.min(wait * 2, Math.max(r.maxBackoffMs, r.backoffMs));
      }
    }
  }
}

type Item = { ev: WaitEvent; resync?: undefined } | { resync: string; ev?: undefined };

/**
 * One delegate's A2A handle. Every change (send, push, reply, update,
 * cancel) carries an idempotency key (docs/PROTOCOL.md §4.11) and is
 * tried again with it while its answer is lost, so it is applied once.
 */
export class Delegate {
  private agentId = "";
  private token = "";
  private registered!: AgentCard;
  private err?: Error;
  private leaving = false;
  /**
   * What the delegate has been told of each task: the basis of a resync's
   * changed, and, for those it knew open, of lost. A resync trims it to
   * the tasks the broker still has, so that it is bounded by them, not by
   * every task the delegate ever saw.
   */
  private seen = new Map<string, Known>();
  private resyncs = 0; // resyncs begun: orders what is seen against their lists
  private lostIds = new Map<string, number>(); // ids reported lost -> the resync that did; a late word of them is ignored
  private queue: Item[] = [];
  private overflow = false;
  private pendingRename?: string;
  private wakers: Array<() => void> = [];
  private readonly asked: string;

  private constructor(
    private readonly s: Session,
    /** The delegate's stable instance id. */
    readonly instanceId: string,
    private card: CardInput,
  ) {
    this.asked = card.name;
  }

  /** @internal a delegate of s, not yet registered: Session.spawn makes them. */
  static create(s: Session, instanceId: string, card: CardInput): Delegate {
    return new Delegate(s, instanceId, card);
  }

  /** The agentId the broker assigned: its peer id, which may differ from the name it asked for. */
  get id(): string {
    return this.agentId;
  }

  /** The session the delegate belongs to. */
  get sessionId(): string {
    return this.s.id;
  }

  /** The card as the broker registered it. */
  get registeredCard(): AgentCard {
    return this.registered;
  }

  /** The sentence that tells the delegate who it is on the bus, for its system prompt. */
  get prompt(): string {
    if (this.agentId !== this.asked) {
      return `Your A2A peer id is ${this.agentId} (${this.asked} was taken on this host). Your session is ${this.sessionId}.`;
    }
    return `Your A2A peer id is ${this.agentId}. Your session is ${this.sessionId}.`;
  }

  /** @internal registers (again) under the naming lock. */
  async register(signal?: AbortSignal): Promise<void> {
    await this.s.naming.run(() => this.registerLocked(signal));
  }

  /**
   * @internal Registers, and adopts what the broker assigns; the first
   * registration also makes the delegate routable, or, when its session
   * closed meanwhile, takes the registration back (close waits for this,
   * under the naming lock, so the link is still open).
   */
  async registerLocked(signal?: AbortSignal): Promise<void> {
    if (this.leaving || this.err) throw this.err ?? new SettledError();
    const first = this.agentId === "";
    const oldId = this.agentId;
    const res: RegisterResult = await this.s.link.call(
      "a2a.agents.register",
      { contextId: this.s.id, card: { ...this.card, name: this.asked }, instanceId: this.instanceId },
      signal,
    );
    if (this.leaving || this.err) {
      // Settle began meanwhile: take this registration back.
      await this.s.link.call("a2a.agents.deregister", { token: res.token }).catch(() => {});
      throw this.err ?? new SettledError();
    }
    this.agentId = res.agentId;
    this.token = res.token;
    this.registered = res.card;
    if (first) {
      if (!this.s.admit(this)) {
        await this.settle({ signal }).catch(() => {}); // the broker's orphan handling covers a failure
        throw new ClosedError(`session ${this.s.id} is closed`);
      }
      return;
    }
    if (oldId && oldId !== res.agentId) {
      this.s.rename(this, oldId, res.agentId);
      this.pendingRename = oldId;
      this.s.opts.tell("renamed", { sessionId: this.s.id, instanceId: this.instanceId, from: oldId, to: res.agentId });
    }
  }

  /** Registers again after a call found `stale` unknown, unless someone did meanwhile. */
  private async reregister(stale: string, signal?: AbortSignal): Promise<void> {
    await this.s.naming.run(async () => {
      if (this.err) throw this.err;
      if (this.token !== stale) return;
      await this.registerLocked(signal);
    });
  }

  private credentials(): string {
    if (this.err) throw this.err;
    return this.token;
  }

  /**
   * One call with the token. A token the broker no longer knows means it
   * restarted: register again by instance id (unless someone did) and try
   * again with the new token, a few times at most.
   */
  private async withToken<T>(signal: AbortSignal | undefined, call: (token: string) => Promise<T>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      const token = this.credentials();
      try {
        return await call(token);
      } catch (err) {
        if (!isCode(err, "A2A_UNAUTHORIZED") || attempt === 3) throw err;
        try {
          await this.reregister(token, signal);
        } catch (rerr) {
          if (rerr instanceof SettledError) throw rerr;
          throw err;
        }
      }
    }
  }

  private call<T>(method: string, params: (token: string) => object, signal?: AbortSignal): Promise<T> {
    return this.withToken(signal, (token) => this.s.link.call(method, params(token), signal));
  }

  /**
   * Records what the delegate now knows of a task: from a call's result,
   * an event or a resync. Calls and events may be told out of order: an
   * older state of a task than the one known is ignored (each change of a
   * task moves its updatedAt forward), so that a task seen terminal is
   * never taken for open again; so is a task reported lost.
   */
  private noteSeen(t?: Task): void {
    if (!t) return;
    if (this.lostIds.has(t.id)) return;
    const k = this.seen.get(t.id);
    if (k && Date.parse(t.updatedAt) < Date.parse(k.at)) return;
    this.seen.set(t.id, { at: t.updatedAt, open: !TERMINAL.has(t.status?.state), gen: this.resyncs });
  }

  /** A change of a task, retried while its answer is lost, within the call's deadline. */
  private async change(method: string, params: (token: string) => object, signal?: AbortSignal): Promise<Task> {
    const res = await this.s.bounded(method, signal, (signal) => this.s.retry(signal, () => this.call<TaskResult>(method, params, signal)));
    this.noteSeen(res.task);
    return res.task;
  }

  /** Every other live agent on the host, each with its session, following the pages. */
  peers(opts: CallOptions = {}): Promise<AgentCard[]> {
    return this.s.bounded("a2a.agents.list", opts.signal, async (signal) => {
      const all: AgentCard[] = [];
      let pageToken = "";
      for (;;) {
        const res = await this.call<ListAgentsResult>("a2a.agents.list", (token) => ({ token, pageSize: 1000, pageToken }), signal);
        all.push(...res.agents);
        if (!res.nextPageToken) return all;
        pageToken = res.nextPageToken;
      }
    });
  }

  /**
   * Creates a task for a peer. `to` names it; undefined or "" lets the
   * broker choose the single peer of this session, else the single peer
   * of the others. A messageId the caller sets says "one intent": a
   * second send with it returns the first's task.
   */
  send(message: MessageInput, opts?: SendOptions): Promise<Task>;
  send(to: string | undefined, message: MessageInput, opts?: SendOptions): Promise<Task>;
  send(a: string | undefined | MessageInput, b?: MessageInput | SendOptions, c?: SendOptions): Promise<Task> {
    const [to, message, opts] = typeof a === "object" ? [undefined, a, (b as SendOptions) ?? {}] : [a, b as MessageInput, c ?? {}];
    const msg = keyed(message);
    return this.change(
      "a2a.message.send",
      (token) => ({ token, ...(to ? { to } : {}), message: msg, ...(opts.metadata ? { metadata: opts.metadata } : {}) }),
      opts.signal,
    );
  }

  /** Sends a oneway message (no task); resolves to the recipient's id. */
  async push(to: string | undefined, message: MessageInput, opts: CallOptions = {}): Promise<string> {
    const msg = keyed(message);
    const res = await this.s.bounded("a2a.message.send", opts.signal, (signal) =>
      this.s.retry(signal, () =>
        this.call<SendResult>("a2a.message.send", (token) => ({ token, ...(to ? { to } : {}), message: msg, oneway: true }), signal),
      ),
    );
    return res.delivered!;
  }

  /** Adds a message to an open task the delegate is a member of. */
  reply(taskId: string, message: MessageInput, opts: CallOptions = {}): Promise<Task> {
    const msg = keyed(message);
    return this.change("a2a.message.send", (token) => ({ token, taskId, message: msg }), opts.signal);
  }

  /** Reads a task the delegate is a member of. */
  async get(taskId: string, opts: CallOptions = {}): Promise<Task> {
    const res = await this.s.bounded("a2a.tasks.get", opts.signal, (signal) => this.call<TaskResult>("a2a.tasks.get", (token) => ({ token, taskId }), signal));
    this.noteSeen(res.task);
    return res.task;
  }

  /** The delegate's tasks, oldest first, following the pages. */
  async list(opts: ListOptions = {}): Promise<Task[]> {
    const tasks = await this.s.bounded("a2a.tasks.list", opts.signal, (signal) => this.listAll({ ...opts, signal }));
    for (const t of tasks) this.noteSeen(t);
    return tasks;
  }

  private async listAll(opts: ListOptions): Promise<Task[]> {
    const all: Task[] = [];
    let pageToken = "";
    for (;;) {
      const res = await this.call<ListTasksResult>(
        "a2a.tasks.list",
        (token) => ({ token, ...(opts.state ? { state: opts.state } : {}), ...(opts.role ? { role: opts.role } : {}), pageToken }),
        opts.signal,
      );
      all.push(...res.tasks);
      if (!res.nextPageToken) return all;
      pageToken = res.nextPageToken;
    }
  }

  /** Moves a task assigned to the delegate to a new state, with an optional message and artifacts. */
  update(taskId: string, state: UpdateState, opts: UpdateOptions = {}): Promise<Task> {
    const msg = opts.message ? keyed(opts.message) : undefined;
    const messageId = msg?.messageId ?? uuid();
    return this.change(
      "a2a.tasks.update",
      (token) => ({ token, taskId, state, messageId, ...(msg ? { message: msg } : {}), ...(opts.artifacts ? { artifacts: opts.artifacts } : {}) }),
      opts.signal,
    );
  }

  /** Cancels a task the delegate requested. */
  cancel(taskId: string, opts: CallOptions = {}): Promise<Task> {
    const messageId = uuid();
    return this.change("a2a.tasks.cancel", (token) => ({ token, taskId, messageId }), opts.signal);
  }

  /**
   * Deregisters the delegate: its open tasks end (failed if assigned to
   * it, canceled if it requested them), and every later call, and a wait
   * in progress, rejects with SettledError.
   */
  async settle(opts: CallOptions = {}): Promise<void> {
    if (this.err) throw this.err;
    this.leaving = true; // no call registers it again from now on
    try {
      await this.s.bounded("a2a.agents.deregister", opts.signal, (signal) => this.s.link.call("a2a.agents.deregister", { token: this.token }, signal));
    } catch (err) {
      if (!isCode(err, "A2A_UNAUTHORIZED")) {
        this.leaving = false; // still registered: it may try again
        throw err;
      }
    }
    this.fail(new SettledError());
    this.s.forget(this);
  }

  /** @internal stops the delegate for good. */
  fail(err: Error): void {
    if (this.err) return;
    this.err = err;
    this.wakeAll();
  }

  private wakeAll(): void {
    for (const w of this.wakers.splice(0)) w();
  }

  /** @internal queues an event; past the queue's size, a resync is due instead. */
  deliver(ev: WaitEvent): void {
    if (this.queue.length >= this.s.opts.queue) this.overflow = true;
    else this.queue.push({ ev });
    this.wakeAll();
  }

  /** @internal queues a resync at this point of the stream. */
  needResync(reason: string): void {
    this.queue.push({ resync: reason });
    this.wakeAll();
  }

  /**
   * Re-reads the delegate's tasks and returns the resync: the tasks that
   * changed since it last heard of them, and the open ones the broker no
   * longer has.
   */
  private async resyncNow(reason: string, signal?: AbortSignal): Promise<Resync> {
    const gen = this.resyncs++; // what was seen before now (gen <= this) precedes the list
    // Every page, both roles, any state. Not through list: that would
    // count them as seen before comparing.
    const tasks = await this.listAll({ signal });
    const present = new Set(tasks.map((t) => t.id));
    // An open task the list lacks is lost only if the broker says so when
    // asked for it: a list that missed a live task (a paging or filter
    // quirk, or a task made since the list was read) never makes it lost.
    const missing = [...this.seen].filter(([id, k]) => k.open && !present.has(id)).map(([id]) => id);
    missing.sort(byCodeUnits);
    const gone: string[] = [];
    for (const id of missing) {
      try {
        // Not through get: that would count it as seen before comparing.
        const res = await this.call<TaskResult>("a2a.tasks.get", (token) => ({ token, taskId: id }), signal);
        if (!res?.task) throw new Error("a2a.tasks.get: a bad result: no task");
        tasks.push(res.task);
        present.add(id);
      } catch (err) {
        if (isCode(err, "A2A_UNKNOWN_TASK")) {
          gone.push(id);
        } else if (signal?.aborted || err instanceof SettledError || err instanceof ClosedError) {
          throw err;
        } else {
          // Not known to be gone: the next resync asks again.
          this.s.opts.logger.debug(`reading task ${id}, missing from the list, failed; kept: ${(err as Error).message}`);
          present.add(id);
        }
      }
    }
    if (tasks.length > 0 && missing.length > 0) tasks.sort((a, b) => byCodeUnits(a.id, b.id)); // stable
    const changed = tasks.filter((t) => this.seen.get(t.id)?.at !== t.updatedAt);
    const lost: string[] = [];
    for (const id of gone) {
      // Still open as the delegate knows it: it may have heard it end
      // meanwhile, or another resync may have reported it.
      if (this.seen.get(id)?.open) {
        lost.push(id);
        this.seen.delete(id);
        this.lostIds.set(id, gen);
      }
    }
    // Forget what the broker no longer has (pruned, or lost and
    // reported): seen before the list began and absent from it.
    for (const [id, k] of this.seen) if (k.gen <= gen && !k.open && !present.has(id)) this.seen.delete(id);
    // A lost id is ignored until a later resync: long enough for a call
    // answered before the break to have been noted.
    for (const [id, g] of this.lostIds) if (g < gen) this.lostIds.delete(id);
    if (lost.length > 0) this.s.opts.tell("lost", { sessionId: this.s.id, delegateId: this.agentId, taskIds: [...lost] });
    const renamedFrom = this.pendingRename;
    this.pendingRename = undefined;
    return renamedFrom ? { reason, changed, lost, renamedFrom } : { reason, changed, lost };
  }

  private noteDelivered(ev: WaitEvent): void {
    if (ev.task?.task) this.noteSeen(ev.task.task);
    if (ev.resync) for (const t of ev.resync.changed) this.noteSeen(t);
  }

  /**
   * The delegate's next event: a task event or push addressed to it
   * (never another session's, never another delegate's), or a resync
   * after a break. Rejects with SettledError once it settles, ClosedError
   * once its session closes, the signal's reason when it aborts. events
   * reads the same queue, and yields the same events flat.
   */
  async wait(opts: CallOptions = {}): Promise<WaitEvent> {
    const { signal } = opts;
    this.s.waiting++;
    try {
      for (;;) {
        if (this.err) throw this.err;
        signal?.throwIfAborted();
        const head = this.queue[0];
        if (head?.ev) {
          this.queue.shift();
          this.noteDelivered(head.ev);
          return head.ev;
        }
        // A resync is this waiter's alone: taken off the queue (or the
        // overflow flag cleared) as it starts, so that a second waiter
        // does not repeat it and events dropped while it reads the tasks
        // make a next one; put back if it fails.
        let reason: string | undefined;
        if (head?.resync !== undefined) {
          this.queue.shift();
          reason = head.resync;
        } else if (this.overflow) {
          this.overflow = false;
          reason = "the wait queue overflowed";
        }
        if (reason !== undefined) {
          let rs: Resync;
          try {
            rs = await this.resyncNow(reason, signal);
          } catch (err) {
            if (head?.resync !== undefined) this.queue.unshift(head);
            else this.overflow = true;
            if (err instanceof SettledError || err instanceof ClosedError || signal?.aborted) throw err;
            this.s.opts.logger.debug(`resync failed; retrying: ${(err as Error).message}`);
            await this.pause(RESYNC_RETRY_MS, signal);
            continue;
          }
          const ev: WaitEvent = { resync: rs };
          this.noteDelivered(ev);
          return ev;
        }
        await this.pause(undefined, signal);
      }
    } finally {
      this.s.waiting--;
    }
  }

  /**
   * The delegate's events, for `for await`: what wait returns, in the same
   * order, as DelegateEvents (flat: `kind`, `taskId`, `state`, `task`,
   * `message`, `final`). It reads the queue wait reads: each event goes
   * to one reader, whichever asks first, so a delegate has one reader. It
   * returns (the loop ends) when the delegate settles or its session or
   * host closes; when the signal aborts it throws an AbortError (its
   * cause the signal's reason), as Node's events.on does. Leaving the
   * loop (break, return, throw) loses no event: the next reader gets it.
   */
  events(opts: CallOptions = {}): AsyncIterableIterator<DelegateEvent> {
    return new EventStream(this, opts.signal);
  }

  /** @internal puts back an event read for a stream that ended meanwhile: the next read returns it. */
  giveBack(ev: WaitEvent): void {
    this.queue.unshift({ ev });
    this.wakeAll();
  }

  /** Waits for a wake-up (an event, the end), ms at most, or the signal. */
  private pause(ms: number | undefined, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve, reject) => {
      let timer: Timer | undefined;
      const done = () => {
        if (timer) clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        const i = this.wakers.indexOf(done);
        if (i >= 0) this.wakers.splice(i, 1);
        resolve();
      };
      const onAbort = () => {
        done();
        reject(signal!.reason);
      };
      if (ms !== undefined) timer = setTimeout(done, ms);
      signal?.addEventListener("abort", onAbort, { once: true });
      this.wakers.push(done);
    });
  }
}

/**
 * The message with its idempotency key: its own messageId when the
 * caller set one, else a new one. A message the delegate received (the
 * broker set its `from`) is a new message when sent on: a new id too.
 */
function keyed(m: MessageInput): Message {
  if (!m || !Array.isArray(m.parts)) throw new TypeError("a message needs parts");
  const fresh = !m.messageId || m.from !== undefined;
  return { ...m, messageId: fresh ? uuid() : m.messageId! } as Message;
}

