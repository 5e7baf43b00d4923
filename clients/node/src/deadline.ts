import { UnavailableError } from "./errors.js";
import { unref } from "./util.js";

/**
 * How long a call may take in all by default (ms): its waits for a broker
 * that is away and its retries included. Long enough for a broker to
 * restart (a sidecar is back within a second) and for a change to be
 * retried across it; short enough that a UI waiting on a call whose
 * broker is gone hears so within seconds, not minutes.
 */
export const DEFAULT_CALL_TIMEOUT_MS = 10_000;

/**
 * Runs one call of a caller's, all its attempts and waits, under one
 * deadline: call gets a signal that aborts when the caller's does (with
 * its reason) or when ms have passed, and past the deadline the call
 * rejects with UnavailableError ("what: no answer within ms ms"), its
 * cause the last attempt's error. An error answered before then, and the
 * caller's own abort, are passed on as they are.
 */
export async function withDeadline<T>(ms: number, what: string, signal: AbortSignal | undefined, call: (signal: AbortSignal) => Promise<T>): Promise<T> {
  signal?.throwIfAborted();
  const ac = new AbortController();
  let expired: UnavailableError | undefined;
  const timer = unref(
    setTimeout(() => {
      expired = new UnavailableError(`${what}: no answer within ${ms} ms`);
      ac.abort(expired);
    }, ms),
  );
  const onAbort = () => ac.abort(signal!.reason);
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    return await call(ac.signal);
  } catch (err) {
    if (expired === undefined || err === expired || signal?.aborted) throw err;
    // The deadline passed during an attempt or a wait: a lost answer.
    if (err instanceof UnavailableError || (err as Error)?.name === "AbortError" || (err as Error)?.name === "TimeoutError") {
      throw new UnavailableError(expired.message, { cause: err });
    }
    throw err;
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener("abort", onAbort);
  }
}
