// The host's events: brokerExit when its broker goes, rejoined when it is
// on one again, resync for each session that resyncs, renamed for a
// delegate that registered again under another id, lost for tasks a
// delegate's resync found gone. brokerPid is undefined from the exit to
// the rejoin.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

import { BUSES, askerAndWorker, binary, checkLeaks, intercept, openHost, tempDir, untilFinal } from "../testkit/helpers.mjs";
import { record } from "../testkit/broker.mjs";

checkLeaks();

/** Takes resync events until every one of ids has had one; returns them. */
async function resyncsOf(events, ids) {
  const got = [];
  while (!ids.every((id) => got.some((r) => r.ev.sessionId === id))) got.push(await events.next("resync"));
  return got;
}

for (const bus of BUSES) {
  test(`TestTheHostTellsOfItsBrokersExitAndTheRejoin [${bus}]`, async (t) => {
    const host = await openHost(t, bus, { dataDir: tempDir(t) });
    const events = record(host);
    const { asker, worker, task } = await askerAndWorker(host);
    const waiting = untilFinal(asker, task.id);
    const old = host.brokerPid;

    process.kill(old, "SIGKILL");
    const exit = await events.next("brokerExit");
    assert.equal(exit.ev.pid, old);
    assert.equal(exit.ev.started, true, "the host started it");
    assert.equal(exit.ev.signal, "SIGKILL");
    assert.match(exit.ev.reason, /exited \(SIGKILL\)/);
    assert.equal(exit.pid, undefined, "brokerPid is undefined once the broker is known gone");

    const rejoined = await events.next("rejoined");
    assert.ok(rejoined.ev.pid > 0 && rejoined.ev.pid !== old, "a new broker");
    assert.equal(rejoined.ev.started, true);
    assert.equal(rejoined.pid, rejoined.ev.pid, "brokerPid is the new broker's from the rejoin on");
    assert.equal(rejoined.ev.rejoins, 1);
    assert.equal(host.rejoins, 1);
    assert.ok(events.seen.indexOf(exit) < events.seen.indexOf(rejoined), "the exit is told before the rejoin");

    for (const r of await resyncsOf(events, ["s1", "s2"])) {
      assert.equal(r.ev.brokerRestarted, true, `${r.ev.sessionId}: ${r.ev.reason}`);
    }
    await worker.update(task.id, "completed");
    assert.equal((await waiting).task.status.state, "completed");
    assert.deepEqual(
      events.seen.filter((x) => x.name === "renamed" || x.name === "lost"),
      [],
      "a durable broker gives the names back and keeps the tasks",
    );
  });

  // A broker that keeps its tasks in memory restarts. The asker's session
  // registers it again only once a newcomer has taken its name: it is
  // renamed. The worker, waiting, is told its open task is lost.
  test(`TestTheHostTellsOfARenameAndOfLostTasks [${bus}]`, async (t) => {
    const host = await openHost(t, bus, { dataDir: "" });
    const events = record(host);
    let release;
    let hold; // while set, session s1's registrations wait for it
    intercept(host, (id) =>
      id !== "s1"
        ? undefined
        : {
            async call(method, params, signal, next) {
              if (method === "a2a.agents.register" && hold) await hold;
              return next();
            },
          },
    );
    const { asker, worker, task } = await askerAndWorker(host);
    const woke = worker.wait({ signal: AbortSignal.timeout(20_000) });

    hold = new Promise((r) => (release = r));
    process.kill(host.brokerPid, "SIGKILL");
    await events.next("rejoined");
    const newcomer = await (await host.session("s3")).spawn({ name: "asker" });
    assert.equal(newcomer.id, "asker", "the newcomer takes the free name");
    hold = undefined;
    release();

    const renamed = await events.next("renamed");
    assert.deepEqual(renamed.ev, { sessionId: "s1", instanceId: asker.instanceId, from: "asker", to: "asker-2" });
    assert.equal(asker.id, "asker-2");

    const ev = await woke;
    assert.deepEqual(ev.resync?.lost, [task.id]);
    const lost = await events.next("lost");
    assert.deepEqual(lost.ev, { sessionId: "s2", delegateId: worker.id, taskIds: [task.id] });
  });
}

// A listener that throws does not disturb the host: the error is thrown
// again outside it (an uncaught exception, here caught by the process),
// and the host goes on. In a process of its own: the test runner takes
// an uncaught exception for a failure.
test("TestAListenerThatThrowsDisturbsNothing [pipe]", async (t) => {
  const dir = tempDir(t);
  const script = join(dir, "host.mjs");
  const dist = new URL("../dist/index.js", import.meta.url).href;
  writeFileSync(
    script,
    `import { Host, text } from ${JSON.stringify(dist)};
const host = await Host.open({ bus: "pipe", binary: process.env.A2A_BUS_BINARY, dataDir: ${JSON.stringify(join(dir, "data"))} });
const boom = new Error("a listener's bug");
host.on("brokerExit", () => { throw boom; });
const uncaught = new Promise((resolve) => process.once("uncaughtException", resolve));
const rejoined = new Promise((resolve) => host.once("rejoined", resolve));
const s = await host.session("s1");
const asker = await s.spawn({ name: "asker" });
await s.spawn({ name: "worker" });
const task = await asker.send("worker", text("job"));
process.kill(host.brokerPid, "SIGKILL");
console.log("uncaught " + ((await uncaught) === boom));
await rejoined;
console.log("task " + (await asker.get(task.id)).id);
await host.close();
`,
  );
  const p = spawn(process.execPath, [script], { stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, A2A_BUS_BINARY: binary() } });
  t.after(() => p.exitCode === null && p.kill("SIGKILL"));
  let out = "";
  p.stdout.on("data", (b) => (out += b));
  const [code] = await once(p, "close");
  assert.match(out, /^uncaught true\ntask [0-9a-f-]+\n$/, "the listener's error was thrown again, and the host went on");
  assert.equal(code, 0);
});
