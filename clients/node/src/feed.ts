import { A2ABusError, ClosedError, RefusedError, isCode } from "./errors.js";
import type { Logger, Notification, SessionLink, Subscription } from "./bus.js";
import { END, TIMEOUT, sleep } from "./util.js";
import type { ReplayResult } from "./wire.gen.js";

/**
 * About how often a waiting feed asks the broker for events it may have
 * missed with nothing to tell it so (each wait is drawn from 80 % to 120 %
 * of it, so that sessions do not check together). A loss the feed is told
 * of (a seq gap, a subscription that ended or dropped events) it replays
 * at once; the check is for what no signal shows.
 */
export const DEFAULT_CHECK_MS = 30_000;

/** How soon a waiting feed asks again after a replay the broker did not answer. */
export const DEFAULT_RETRY_MS = 2000;

/** A break in the feed that replay could not bridge. */
export interface Gap {
  /** The broker's current epoch. */
  epoch: string;
  /** True when the broker restarted: registrations are gone too. */
  newEpoch: boolean;
  reason: string;
}

/** What Feed.next returns: an event, or a gap. */
export type FeedItem = { event: Notification; gap?: undefined } | { gap: Gap; event?: undefined };

export interface FeedOptions {
  /** See DEFAULT_CHECK_MS. */
  checkMs?: number;
  /** See DEFAULT_RETRY_MS. */
  retryMs?: number;
  /** Asked at each check whether anyone waits; when nobody does, the check is skipped. */
  shouldCheck?: () => boolean;
  logger: Logger;
}

/**
 * One session's notifications in seq order without gaps: it replays what
 * the bus lost (a seq gap, a lagging reader's drops, a lost subscription,
 * a lost last event found by the check) and says when that is not possible.
 * The port of the Go runtime's Feed; one reader calls next.
 */
export class Feed {
  private sub!: Subscription;
  private dropped = 0;
  private epochNow = "";
  private nextSeq = 0;
  private lastSeq = 0; // the session's last seq, as the latest replay said
  private queue: FeedItem[] = [];
  private readonly checkMs: number;
  private readonly retryMs: number;
  /** Set while the broker has not answered the latest replay: the next comes after retryMs. */
  private unsure = false;
  replayed = 0;
  gaps = 0;

  private constructor(
    private readonly link: SessionLink,
    private readonly o: FeedOptions,
  ) {
    this.checkMs = o.checkMs ?? DEFAULT_CHECK_MS;
    this.retryMs = o.retryMs ?? DEFAULT_RETRY_MS;
  }

  /** Subscribes and learns where the session stands: next returns only what comes after. */
  static async open(link: SessionLink, o: FeedOptions, signal?: AbortSignal): Promise<Feed> {
    const f = new Feed(link, o);
    f.sub = await link.subscribe(signal);
    try {
      const res: ReplayResult = await link.call("a2a.events.replay", { contextId: link.id }, signal);
      if (!res?.epoch) throw new Error("a bad replay result");
      f.epochNow = res.epoch;
      f.nextSeq = res.lastSeq + 1;
      f.lastSeq = res.lastSeq;
    } catch (err) {
      f.sub.close();
      throw err;
    }
    return f;
  }

  get epoch(): string {
    return this.epochNow;
  }

  close(): void {
    this.sub.close();
  }

  /** The next event or gap; rejects with ClosedError once the session is closed. */
  async next(signal: AbortSignal): Promise<FeedItem> {
    let due = Date.now() + this.wait();
    while (this.queue.length === 0) {
      if (this.unsure) due = Math.min(due, Date.now() + this.retryMs);
      const d = this.sub.queue.dropped;
      if (d !== this.dropped) {
        this.dropped = d;
        await this.catchUp(signal, "the subscription dropped events");
        continue;
      }
      const got = await this.sub.queue.get(signal, Math.max(due - Date.now(), 0));
      if (got === END) {
        await this.resubscribe(signal);
        continue;
      }
      if (got === TIMEOUT) {
        if (!this.o.shouldCheck || this.o.shouldCheck()) await this.catchUp(signal, "");
        due = Date.now() + this.wait();
        continue;
      }
      await this.take(signal, got);
    }
    return this.queue.shift()!;
  }

  /** How long next waits before it asks the broker on its own. */
  private wait(): number {
    if (this.unsure) return this.retryMs;
    return this.checkMs * (0.8 + 0.4 * Math.random());
  }

  private async take(signal: AbortSignal, n: Notification): Promise<void> {
    const h = n?.params;
    if (!h || typeof h !== "object" || typeof h.seq !== "number" || typeof h.recipient !== "string") return; // not a notification we can use
    if ((h.recipientContextId || h.contextId) !== this.link.id) return; // not ours
    if (h.epoch !== this.epochNow) {
      // A late event of a run that is over, or the first of a new run.
      const answered = await this.catchUp(signal, "");
      if (!answered || h.epoch !== this.epochNow) return; // replay brings what counts
    }
    if (h.seq < this.nextSeq) return; // delivered already
    if (h.seq > this.nextSeq) {
      const answered = await this.catchUp(signal, "a gap in seq");
      if (!answered) return; // out of reach: a later replay fills the gap, this one included
      if (h.seq < this.nextSeq) return;
      // It came before the replay was answered, so its seq is at most the
      // session's last one then: one beyond is no event of this broker's.
      if (h.seq > this.lastSeq) return;
      if (h.seq > this.nextSeq) {
        this.queue.push({ gap: { epoch: this.epochNow, newEpoch: false, reason: `events ${this.nextSeq} to ${h.seq - 1} are lost` } });
        this.gaps++;
      }
    }
    this.queue.push({ event: n });
    this.nextSeq = h.seq + 1;
  }

  /**
   * Replays everything after the last delivered seq; a gap replay cannot
   * fill, or a new epoch, becomes a Gap. Reports whether the broker
   * answered: one out of reach is no error (next tries again after retryMs).
   */
  private async catchUp(signal: AbortSignal, why: string): Promise<boolean> {
    for (let attempt = 0; ; attempt++) {
      let res: ReplayResult;
      try {
        res = await this.link.call(
          "a2a.events.replay",
          { contextId: this.link.id, epoch: this.epochNow, afterSeq: this.nextSeq - 1 },
          signal,
        );
      } catch (err) {
        if (isCode(err, "A2A_REPLAY_GAP") && (err as A2ABusError).data?.epoch && attempt < 3) {
          const data = (err as A2ABusError).data!;
          const newEpoch = data.epoch !== this.epochNow;
          let reason = newEpoch ? "the broker restarted" : "events were lost beyond the replay window";
          if (why) reason = `${why}: ${reason}`;
          this.queue.push({ gap: { epoch: data.epoch!, newEpoch, reason } });
          this.gaps++;
          this.epochNow = data.epoch!;
          this.nextSeq = newEpoch ? 1 : Math.max(data.oldestSeq ?? 1, 1);
          why = "";
          continue; // take what the broker still holds from there on
        }
        if (err instanceof ClosedError) throw err;
        if (signal.aborted) throw signal.reason;
        this.o.logger.debug(`replay failed; will retry: ${(err as Error).message}`);
        this.unsure = true;
        return false;
      }
      this.unsure = false;
      this.lastSeq = res.lastSeq;
      if (this.enqueue(res.events as unknown as Notification[]) > 0 && this.nextSeq <= res.lastSeq) {
        attempt = -1; // a page at a time: on to the next
        continue;
      }
      return true;
    }
  }

  private enqueue(events: Notification[]): number {
    let n = 0;
    for (const ev of events ?? []) {
      const seq = ev?.params?.seq;
      if (typeof ev?.params?.recipient !== "string") continue;
      if (typeof seq === "number" && seq >= this.nextSeq) {
        this.queue.push({ event: ev });
        this.nextSeq = seq + 1;
        n++;
      }
    }
    this.replayed += n;
    if (n > 0) this.o.logger.debug(`replayed ${n} missed events`);
    return n;
  }

  /** Replaces a subscription that ended, then replays what passed meanwhile. */
  private async resubscribe(signal: AbortSignal): Promise<void> {
    let backoff = 50;
    this.sub.close(); // ended: let its link forget it
    for (;;) {
      try {
        this.sub = await this.link.subscribe(signal);
        this.dropped = 0;
        await this.catchUp(signal, "resubscribed");
        return;
      } catch (err) {
        if (err instanceof ClosedError || err instanceof RefusedError) throw err;
        if (signal.aborted) throw signal.reason;
        this.o.logger.debug(`resubscribe failed; retrying: ${(err as Error).message}`);
        await sleep(backoff, signal);
        backoff = Math.min(backoff * 2, 2000);
      }
    }
  }
}
