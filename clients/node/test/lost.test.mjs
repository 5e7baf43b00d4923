// Lost work: a broker that keeps tasks in memory and restarts has lost
// the open ones; a delegate waiting on one is told so by its resync
// (Resync.lost), not left to wait. The same scenarios as the Go runtime's
// (runtime: Resync.Lost), by name, against a real broker on each bus.
import { test } from "node:test";
import assert from "node:assert/strict";

import { isCode } from "../dist/index.js";
import { BUSES, next, openHost, tempDir, text, checkLeaks, intercept, askerAndWorker, killBroker } from "../testkit/helpers.mjs";

checkLeaks();

// The safety check is left far beyond the tests' bounds: what wakes the
// delegates is the rejoin, not a check.
const CHECK_MS = 600_000;

/** d's next resync within ms, skipping task events. */
async function nextResync(d, ms = 15_000) {
  const signal = AbortSignal.timeout(ms);
  for (;;) {
    const ev = await d.wait({ signal });
    if (ev.resync) return ev.resync;
  }
}

for (const bus of BUSES) {
  test(`TestAWaitingDelegateIsToldItsTaskWasLost [${bus}]`, async (t) => {
    const host = await openHost(t, bus, { dataDir: "", checkMs: CHECK_MS });
    const { asker, worker, task } = await askerAndWorker(host);
    // A task that ended before the restart: gone too, but no lost work.
    const ended = await asker.send("worker", text("quick"));
    assert.equal((await next(worker)).task.taskId, ended.id);
    await worker.update(ended.id, "completed");
    const done = (await next(asker)).task;
    assert.equal(done.taskId, ended.id);
    assert.equal(done.final, true);

    // Both wait on the open task, each blocked in wait, as the broker dies.
    const askerWoke = asker.wait({ signal: AbortSignal.timeout(15_000) });
    const workerWoke = worker.wait({ signal: AbortSignal.timeout(15_000) });
    await killBroker(host);

    for (const [who, woke] of [["asker", askerWoke], ["worker", workerWoke]]) {
      const ev = await woke;
      assert.ok(ev.resync, `the ${who} was woken by a resync: ${JSON.stringify(ev)}`);
      assert.deepEqual(ev.resync.lost, [task.id], `the ${who} is told its open task was lost, and only it`);
      assert.deepEqual(ev.resync.changed, [], `the ${who}'s broker has no task left`);
    }
    await assert.rejects(asker.get(task.id), (err) => isCode(err, "A2A_UNKNOWN_TASK"));
    // What the delegates keep of their tasks is bounded by what the broker
    // has: the lost task and the ended one (gone too) are forgotten.
    for (const d of [asker, worker]) assert.deepEqual([...d.seen.keys()], [], `${d.id} forgot the tasks that are gone`);

    // Told once: a second restart does not repeat it; a task sent since is
    // still there afterwards, and not lost.
    const fresh = await asker.send("worker", text("again"));
    assert.equal((await next(worker)).task.taskId, fresh.id);
    await worker.update(fresh.id, "working");
    assert.equal((await next(asker)).task.kind, "status");
    const pid = host.brokerPid;
    const askerAgain = nextResync(asker);
    const workerAgain = nextResync(worker);
    await killBroker(host);
    for (const [who, rs] of [["asker", await askerAgain], ["worker", await workerAgain]]) {
      assert.deepEqual(rs.lost, [fresh.id], `the ${who} hears of the second task only: ${JSON.stringify(rs)}`);
    }
    assert.notEqual(host.brokerPid, pid);
  });

  test(`TestATaskStillPresentIsNeverLost [${bus}]`, async (t) => {
    // A durable broker restarts: its tasks are back. The asker's task list
    // misses the open task (a paging quirk, injected): the get that
    // confirms each candidate finds it, and it is not lost.
    const host = await openHost(t, bus, { dataDir: tempDir(t), checkMs: CHECK_MS });
    const quirk = { hide: undefined, hidden: 0 };
    intercept(host, (id) =>
      id !== "s1"
        ? undefined
        : {
            async call(method, params, signal, next) {
              const res = await next();
              if (method === "a2a.tasks.list" && quirk.hide) {
                const tasks = res.tasks.filter((x) => x.id !== quirk.hide);
                quirk.hidden += res.tasks.length - tasks.length;
                return { ...res, tasks };
              }
              return res;
            },
          },
    );
    const { asker, worker, task } = await askerAndWorker(host);
    quirk.hide = task.id;
    const askerWoke = nextResync(asker);
    const workerWoke = nextResync(worker);
    await killBroker(host);
    const rs = await askerWoke;
    assert.ok(quirk.hidden > 0, "the asker's list missed the task");
    assert.deepEqual(rs.lost, [], "a task the broker still has is not lost");
    assert.deepEqual((await workerWoke).lost, []);

    // It is still open, and the asker still hears of it.
    quirk.hide = undefined;
    await worker.update(task.id, "completed", { message: text("done") });
    let ev = await next(asker);
    while (ev.resync) ev = await next(asker);
    assert.equal(ev.task.taskId, task.id);
    assert.equal(ev.task.final, true);
  });
}
