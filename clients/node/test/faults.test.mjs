// Faults: the same scenarios as the Go runtime's fault tests
// (runtime/faults_test.go, runtime/retry_test.go, e2e/faults_test.go,
// host/rejoin_test.go), by name, against a real broker on each bus.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { join } from "node:path";

import { Host, UnavailableError } from "../dist/index.js";
import { BUSES, binary, next, openHost, tempDir, text, untilFinal, checkLeaks, intercept, askerAndWorker } from "../testkit/helpers.mjs";

/** Loses the next `plan.drop` notifications for `plan.recipient` in session s1. */
function losing(host, plan) {
  intercept(host, (id) =>
    id !== "s1"
      ? undefined
      : {
          deliver(n, put) {
            if (plan.drop > 0 && n.params?.recipient === plan.recipient) {
              plan.drop--;
              plan.lost.push(n);
              return true;
            }
            return put(n);
          },
        },
  );
}

for (const bus of BUSES) {
  test(`TestWaitingDelegateWakesThoughTheEventWasLost [${bus}]`, async (t) => {
    const host = await openHost(t, bus);
    const plan = { recipient: "asker", drop: 0, lost: [] };
    losing(host, plan);
    const { asker, worker, task } = await askerAndWorker(host);

    // The only event the asker will get is lost on the way: no later
    // event shows a seq gap, so only the runtime's polling finds it.
    plan.drop = 1;
    const woke = asker.wait({ signal: AbortSignal.timeout(15_000) });
    await worker.update(task.id, "completed", { message: text("done") });
    const ev = await woke;
    assert.equal(plan.lost.length, 1, "the event was really lost");
    assert.equal(ev.task.taskId, task.id);
    assert.equal(ev.task.task.status.state, "completed");
    assert.equal(ev.task.message.parts[0].text, "done");
    assert.equal(ev.task.seq, plan.lost[0].params.seq, "the replayed event is the lost one");
  });

  test(`TestFeedFillsAGapByReplay [${bus}]`, async (t) => {
    const host = await openHost(t, bus, { checkMs: 60_000 }); // no check within the test: the gap alone must tell
    const plan = { recipient: "asker", drop: 0, lost: [] };
    losing(host, plan);
    const { asker, worker, task } = await askerAndWorker(host);
    plan.drop = 2;
    await worker.update(task.id, "working", { message: text("1") });
    await worker.reply(task.id, text("2"));
    await worker.update(task.id, "completed", { message: text("3") });
    const got = [];
    for (let i = 0; i < 3; i++) got.push((await next(asker)).task.message.parts[0].text);
    assert.equal(plan.lost.length, 2);
    assert.deepEqual(got, ["1", "2", "3"], "in order, none lost");
    // None twice: the next event the asker hears is that of a new task.
    const after = await worker.send("asker", text("4"));
    assert.equal((await next(asker)).task?.taskId, after.id, "none twice");
  });

  test(`TestChangesWhoseAnswerWasLostAreRetriedAndAppliedOnce [${bus}]`, async (t) => {
    const host = await openHost(t, bus, { retry: { attempts: 4, backoffMs: 20, maxBackoffMs: 100 } });
    const lose = new Set(["a2a.message.send", "a2a.tasks.update", "a2a.tasks.cancel"]);
    let lost = 0;
    intercept(host, () => ({
      async call(method, params, signal, next) {
        const res = await next();
        if (lose.delete(method)) {
          lost++;
          throw new UnavailableError(`${method}: the answer was lost (injected)`);
        }
        return res;
      },
    }));
    const asker = await (await host.session("s1")).spawn({ name: "asker" });
    const worker = await (await host.session("s2")).spawn({ name: "worker" });
    const task = await asker.send("worker", text("once"));
    const second = await asker.send("worker", text("twice"));
    await worker.update(task.id, "working", { message: text("on it") });
    await asker.cancel(second.id);
    assert.equal(lost, 3, "each kind of change had its answer lost once");

    const tasks = await worker.list();
    assert.deepEqual(tasks.map((x) => x.id), [task.id, second.id], "one task per send");
    const t1 = tasks[0];
    assert.equal(t1.history.length, 2, "the update's message was appended once");
    assert.equal(tasks[1].status.state, "canceled");
    // The worker heard of each change once: what it hears before a third
    // task's event.
    const third = await asker.send("worker", text("third"));
    const kinds = [];
    for (let ev; (ev = await next(worker)).task?.taskId !== third.id; ) {
      kinds.push(ev.task ? `${ev.task.taskId === task.id ? 1 : ev.task.taskId === second.id ? 2 : "?"}:${ev.task.kind}` : Object.keys(ev)[0]);
    }
    assert.deepEqual(kinds, ["1:created", "2:created", "2:status"]);
  });

  test(`TestWaitingDelegateWakesAcrossABrokerRestart [${bus}]`, async (t) => {
    const host = await openHost(t, bus, { dataDir: tempDir(t) });
    const { asker, worker, task } = await askerAndWorker(host);
    const waiting = untilFinal(asker, task.id);

    // The broker dies under the waiting delegate; the host starts it
    // again on the same store.
    const pid = host.brokerPid;
    process.kill(pid, "SIGKILL");

    const done = await worker.update(task.id, "completed", { message: text("done") });
    assert.equal(done.status.state, "completed", "the worker registered again and its update went through");
    assert.equal(worker.id, "worker");
    const { task: heard, seen } = await waiting;
    assert.equal(heard.status.state, "completed");
    assert.ok(seen.some((ev) => ev.resync), "the asker was told of the break");
    assert.notEqual(host.brokerPid, pid);
    assert.ok(host.rejoins >= 1);
    // And the bus works as before.
    const again = await asker.send("worker", text("next"));
    let ev = await next(worker);
    while (ev.resync) ev = await next(worker); // the worker heard of the break too
    assert.equal(ev.task.taskId, again.id);
  });
}

test("TestRuntimeReconnectsMidTask [nats]", async (t) => {
  const host = await openHost(t, "nats");
  const s1 = await host.session("far");
  const asker = await s1.spawn({ name: "asker" });
  const worker = await (await host.session("near")).spawn({ name: "worker" });
  const task = await asker.send("worker", text("job"));
  await next(worker);

  // Cut the asker's session connection, and complete the task while it is down.
  const waiting = untilFinal(asker, task.id);
  const nc = s1.link.conn.nc;
  await nc.close();
  assert.ok(nc.isClosed());
  await worker.update(task.id, "completed");
  const { task: heard } = await waiting;
  assert.equal(heard.status.state, "completed");
  assert.notEqual(s1.link.conn.nc, nc, "the session connected again");
});

test("TestAHostRejoinsARestartedSidecar [nats]", async (t) => {
  const dir = tempDir(t);
  const path = join(dir, "run", "connection.json");
  const data = join(dir, "data");
  const sidecar = () =>
    new Promise((resolve, reject) => {
      const p = spawn(binary(), ["serve", `--connection-file=${path}`, `--data-dir=${data}`], { stdio: ["ignore", "ignore", "pipe"] });
      const lines = createInterface({ input: p.stderr });
      lines.once("line", (first) => (first === path ? resolve(p) : reject(new Error(first))));
      lines.on("line", () => {});
      p.once("error", reject);
    });
  let broker = await sidecar();
  t.after(() => broker.kill("SIGKILL"));
  const host = await Host.open({ bus: "nats", connectionFile: path, checkMs: 200, callTimeoutMs: 10_000 });
  t.after(() => host.close());
  assert.equal(host.brokerPid, broker.pid);
  const { asker, worker, task } = await askerAndWorker(host);
  const waiting = untilFinal(asker, task.id);

  broker.kill("SIGKILL");
  await new Promise((r) => broker.once("close", r));
  broker = await sidecar(); // what the desktop host would do: a new broker, a new port and token

  await worker.update(task.id, "completed");
  assert.equal((await waiting).task.status.state, "completed");
  assert.equal(host.brokerPid, broker.pid);
  assert.equal(host.rejoins, 1);
});
