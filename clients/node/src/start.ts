import { BrokerRunningError, BrokerStartError } from "./errors.js";

/** How a child that was to be the broker ended before it was ready. */
export interface StartExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The spawn's error, when it did not run at all. */
  error?: Error;
}

/** What serve says when a live broker holds its connection file (connfile.ErrRunning). */
const RUNNING = /a broker is already running(?: \(pid (\d+), [^)]*\))?; its connection file is (.+)$/;

/** What serve says when another broker holds its data dir (pebblestore.ErrLocked). */
const DATA_DIR_HELD = /held by another running broker/;

/**
 * The error for a broker that never got going: `what` names it ("a2a-bus
 * serve"), `exit` says how it ended, `output` holds its last lines on
 * stderr. A broker refused because another runs is a BrokerRunningError:
 * at the connection file, which it names (a host joins that one), or on
 * the data dir.
 */
export function startFailure(what: string, exit: StartExit, output: string[]): BrokerStartError {
  if (exit.error) {
    return new BrokerStartError(`${what} could not start: ${exit.error.message}`, { cause: exit.error, output });
  }
  const o = { exitCode: exit.code, signal: exit.signal, output };
  const message = `${what} exited (${exit.signal ?? exit.code}) before it was ready${output.length > 0 ? `: ${output.join(" | ")}` : ", and printed nothing"}`;
  for (const line of output) {
    const m = RUNNING.exec(line);
    if (m) return new BrokerRunningError(message, { ...o, connectionFile: m[2], pid: m[1] === undefined ? undefined : Number(m[1]) });
  }
  if (output.some((line) => DATA_DIR_HELD.test(line))) {
    return new BrokerRunningError(
      `${message}. Another broker runs on this data dir: join it with its connection file (bus "nats", connectionFile, no binary), or give this host its own dataDir ("" keeps tasks in memory)`,
      { ...o, dataDir: true },
    );
  }
  return new BrokerStartError(message, o);
}
