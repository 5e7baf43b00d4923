import { performance } from "node:perf_hooks";

import type { Logger } from "./bus.js";

/**
 * How long a broker has to answer a health check (a2a.admin.info) before
 * the host takes it for dead (ms). A broker on the same machine answers it
 * in a millisecond or two, and a busy one (a large fsync, a GC pause, a
 * laptop under load) well within a second; five seconds is long enough
 * not to kill one that is merely slow, and short enough that a delegate
 * waiting on a stuck broker is served by a new one within about twice
 * that (a call noticed to stall, then the check's own deadline).
 */
export const DEFAULT_HEALTH_TIMEOUT_MS = 5000;

/**
 * How often a host whose broker has said nothing for that long checks it
 * (ms): one small call every 10 s, and none while calls are answered.
 */
export const HEALTH_IDLE_MS = 10_000;

/**
 * A deadline that fires later than this past its time (ms) means this
 * process did not run meanwhile (stopped, suspended, or its event loop
 * blocked): the broker's silence then proves nothing, and it is asked again.
 */
const LATE_MS = 1000;

/** How many times a check is made again because this process was late, before it decides anyway. */
const MAX_LATE_RETRIES = 3;

export interface WatchdogOptions {
  /** How long the broker has to answer a check (ms). */
  timeoutMs: number;
  /** How often an idle broker is checked (ms). */
  idleMs: number;
  /** One a2a.admin.info on this broker: resolves when it answered (an error answer is an answer), rejects otherwise. */
  probe(): Promise<unknown>;
  /** The broker did not answer: called once, then the watchdog stops. */
  dead(why: string): void;
  logger: Logger;
}

/**
 * Watches one broker (one child, one connection): it checks the broker
 * with a bounded health call when a call has waited longer than the
 * deadline, and on a slow timer while nothing is heard from it, and calls
 * dead once when a check goes unanswered. Its timers never keep the
 * process alive.
 *
 * A deadline that fired late (this process was stopped, as a laptop lid or
 * a debugger does, or its event loop was blocked) does not count: the
 * answer may be waiting unread, so the check is made again first.
 */
export class Watchdog {
  private lastHeard = performance.now();
  private checking = false;
  private stopped = false;
  private idle?: NodeJS.Timeout;

  constructor(private readonly o: WatchdogOptions) {
    this.armIdle();
  }

  /** The broker answered something: it runs. */
  heard(): void {
    this.lastHeard = performance.now();
  }

  /**
   * Watches one call: when it is still unanswered after the deadline, the
   * broker is checked. Returns the function that ends the watch (the call
   * was answered or given up).
   */
  watch(): () => void {
    if (this.stopped) return noop;
    const t = setTimeout(() => this.suspect(`a call has waited ${this.o.timeoutMs} ms`), this.o.timeoutMs);
    t.unref();
    return () => clearTimeout(t);
  }

  /** Something is off (a call stalled, the broker wrote garbage): check it now, unless a check is under way. */
  suspect(why: string): void {
    if (this.stopped || this.checking) return;
    void this.check(why);
  }

  stop(): void {
    this.stopped = true;
    if (this.idle) clearTimeout(this.idle);
  }

  private armIdle(): void {
    if (this.stopped) return;
    this.idle = setTimeout(() => {
      // Heard from within half the interval: it ran a moment ago. Else a
      // check, so that a broker stuck while idle is found within one to
      // one and a half intervals, plus the deadline.
      const quiet = performance.now() - this.lastHeard;
      if (quiet >= this.o.idleMs / 2) this.suspect(`nothing was heard from it for ${Math.round(quiet)} ms`);
      this.armIdle();
    }, this.o.idleMs);
    this.idle.unref();
  }

  private async check(why: string): Promise<void> {
    this.checking = true;
    this.o.logger.debug(`checking the broker: ${why}`);
    try {
      for (let late = 0; ; late++) {
        if (this.stopped) return;
        const sent = performance.now();
        let answered = false;
        const probe = this.o.probe().then(
          () => {
            answered = true;
            this.heard();
          },
          () => {}, // no answer: the deadline decides
        );
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([probe, new Promise<void>((r) => (timer = setTimeout(r, this.o.timeoutMs)).unref())]);
        clearTimeout(timer);
        const fired = performance.now();
        if (answered || this.lastHeard > sent) return;
        // An answer that came while this process did not run is read
        // after its timers: let it be read before deciding.
        await new Promise<void>((r) => setImmediate(r));
        if (answered || this.lastHeard > sent || this.stopped) return;
        const lateBy = fired - sent - this.o.timeoutMs;
        if (lateBy > LATE_MS && late < MAX_LATE_RETRIES) {
          this.o.logger.info(`the broker's health check ended ${Math.round(lateBy)} ms late (this process did not run meanwhile); checking it again`);
          continue;
        }
        this.stopped = true;
        if (this.idle) clearTimeout(this.idle);
        this.o.dead(`it did not answer a2a.admin.info within ${this.o.timeoutMs} ms (checked because ${why})`);
        return;
      }
    } finally {
      this.checking = false;
    }
  }
}

function noop(): void {}
