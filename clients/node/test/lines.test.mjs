// A pipe child that writes what no broker writes (lines that are no
// JSON, a line without end) is taken for broken and replaced: the host
// stays up, its memory bounded by the longest line a broker writes
// (readline held an endless line whole: 500 MiB at 400 MB, then
// "RangeError: Invalid string length").
import { test } from "node:test";
import assert from "node:assert/strict";
import { chmodSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { Host } from "../dist/index.js";
import { askerAndWorker, binary, checkLeaks, tempDir, text, untilFinal } from "../testkit/helpers.mjs";

checkLeaks();

const FAKE = fileURLToPath(new URL("../testkit/fake-broker.mjs", import.meta.url));
/** The longest line a default broker writes: its payload limit, 8 MiB. */
const LINE_BOUND = 8 << 20;

/** A broker command that runs the fake broker in mode the first time, and the real one after. */
function fakeOnce(t, mode) {
  const dir = tempDir(t);
  const ran = join(dir, "ran");
  const script = join(dir, "broker.sh");
  writeFileSync(
    script,
    `#!/bin/sh\nif [ -e '${ran}' ]; then exec '${binary()}' "$@"; fi\n: > '${ran}'\nexec '${process.execPath}' '${FAKE}' ${mode} "$@"\n`,
  );
  chmodSync(script, 0o755);
  return script;
}

/** Samples this process's RSS until the test ends; returns what reads the peak so far. */
function peakRss(t) {
  let peak = process.memoryUsage().rss;
  const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 5);
  timer.unref();
  t.after(() => clearInterval(timer));
  return () => Math.max(peak, process.memoryUsage().rss);
}

async function waitFor(cond, ms, what) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

for (const [mode, name] of [
  ["garbage", "TestAPipeChildThatWritesGarbageIsReplaced"],
  ["endless", "TestAPipeChildThatWritesAnEndlessLineIsReplaced"],
]) {
  test(`${name} [pipe]`, { timeout: 60_000 }, async (t) => {
    const base = process.memoryUsage().rss;
    const peak = peakRss(t);
    const said = [];
    const logger = { debug() {}, info() {}, warn: (m) => said.push(m), error: (m) => said.push(m) };
    const host = await Host.open({ bus: "pipe", binary: fakeOnce(t, mode), dataDir: "", checkMs: 200, callTimeoutMs: 10_000, healthTimeoutMs: 1000, logger });
    t.after(() => host.close());
    const fake = host.brokerPid;
    const t0 = Date.now();
    await waitFor(() => host.brokerPid !== undefined && host.brokerPid !== fake, 20_000, "the fake broker is replaced");
    const replaced = Date.now() - t0;
    const top = peak();
    t.diagnostic(`replaced ${replaced} ms after it began; RSS ${(base / 2 ** 20).toFixed(0)} MiB, peak ${(top / 2 ** 20).toFixed(0)} MiB`);
    assert.ok(top - base < 4 * LINE_BOUND, `RSS grew by ${((top - base) / 2 ** 20).toFixed(0)} MiB, over 4 × the ${LINE_BOUND >> 20} MiB line bound`);
    assert.equal(said.filter((m) => /taken for dead/.test(m)).length, 1, `the decision is told once: ${said.join(" | ")}`);

    // The host, never reopened, works on with the real broker.
    const { asker, worker, task } = await askerAndWorker(host);
    const waiting = untilFinal(asker, task.id);
    await worker.update(task.id, "completed", { message: text("done") });
    assert.equal((await waiting).task.status.state, "completed");
    assert.equal(host.rejoins, 1);
  });
}

test("TestLinesAreSplitAndBounded", async () => {
  const { LineSplitter } = await import("../dist/lines.js");
  const got = [];
  let over = 0;
  const s = new LineSplitter(8, (b) => got.push(b.toString()), () => over++);
  for (const chunk of ["ab", "c\r\nde", "f\n\n12345678\r\n", "123456789", "0123", "\nok", "\n", "x"]) s.push(Buffer.from(chunk));
  s.end();
  // "123456789…0123" passed 8 bytes: dropped as it came, told once; the
  // line after it is read as before.
  assert.deepEqual(got, ["abc", "def", "", "12345678", "ok", "x"]);
  assert.equal(over, 1);
});
