// What a second hostile review of the package found, each kept as a test:
// deep requests on the pipe, resyncs under overflow and with several
// waiters, a session opened while its host closes.
import { test } from "node:test";
import assert from "node:assert/strict";

import { ClosedError, UnavailableError } from "../dist/index.js";
import { BUSES, countCalls, openHost, text, checkLeaks } from "../testkit/helpers.mjs";

checkLeaks();

/** Waits until cond holds (ms at most). */
async function until(cond, ms, what) {
  for (const end = Date.now() + ms; !cond(); ) {
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Counts the events handed to delegate d: {n}. */
function countDelivered(d) {
  const count = { n: 0 };
  const deliver = d.deliver.bind(d);
  d.deliver = (ev) => {
    count.n++;
    deliver(ev);
  };
  return count;
}

// A request nested deeper than 128 levels (PROTOCOL §11) is refused by the
// broker with -32600 and, on the pipe, "id": null (wire.ParseRequest fails
// before the id is read). PipeBus.onLine logs that answer and drops it, so
// the call waits callTimeoutMs, fails as UnavailableError ("answer lost")
// and Session.retry sends it again: attempts × callTimeoutMs in all (six
// times 30 s by default) for an error that is certain. On NATS the same
// request fails at once with INVALID_REQUEST (the reply subject matches).
// At once: a call that waited for an answer would end as unavailable,
// and a retry would be a second attempt.
for (const bus of BUSES) {
  test(`TestARequestNestedTooDeeplyFailsAtOnce [${bus}]`, async (t) => {
    const host = await openHost(t, bus, { retry: { attempts: 2, backoffMs: 10, maxBackoffMs: 10 } });
    const sends = countCalls(host, "a2a.message.send");
    const s = await host.session("s1");
    const a = await s.spawn({ name: "a" });
    await s.spawn({ name: "b" });
    const deep = {};
    let cur = deep;
    for (let i = 0; i < 200; i++) cur = cur.x = {};
    const err = await a.send("b", text("hi"), { metadata: deep }).then(
      () => undefined,
      (e) => e,
    );
    assert.ok(err, "the send is refused");
    assert.ok(!(err instanceof UnavailableError), `a request the broker refused is no lost answer (${err.name}: ${err.message})`);
    assert.equal(err.code, "INVALID_REQUEST");
    assert.equal(sends.n, 1, "refused at once, not retried");
  });
}

// Delegate.wait, overflow case: when the wait queue has overflowed and
// is drained, wait re-reads the tasks (resyncNow) and then clears
// `overflow` (`else this.overflow = false`). Events dropped while that
// list call was under way set `overflow` again, and clearing it after the
// answer forgets them: the list was read before they happened, so
// neither the resync nor any later event tells the delegate of that task.
// (runtime/delegate.go Wait has the same lines.) Fix: clear overflow when
// the resync starts, and set it again if the resync fails.
test("TestEventsDroppedDuringAnOverflowResyncAreNotLost [pipe]", async (t) => {
  const host = await openHost(t, "pipe", { queue: 2 });
  const ws = await host.session("w");
  const w = await ws.spawn({ name: "w" });
  const p = await (await host.session("p")).spawn({ name: "p" });
  const delivered = countDelivered(w);
  const sent = [];
  const seen = new Set();
  const take = (ev) => {
    if (ev.task) seen.add(ev.task.taskId);
    for (const x of ev.resync?.changed ?? []) seen.add(x.id);
  };
  for (let i = 0; i < 3; i++) sent.push((await p.send("w", text(`first ${i}`))).id);
  await until(() => delivered.n >= 3, 10_000, "the three events reach w"); // two queued, the third dropped: overflow
  assert.ok(w.overflow, "the wait queue overflowed");
  take(await w.wait());
  take(await w.wait());
  // The overflow resync is due: hold its tasks.list answer while more come.
  const call = ws.link.call.bind(ws.link);
  let release;
  const gate = new Promise((r) => (release = r));
  let holding;
  const held = new Promise((r) => (holding = r));
  ws.link.call = async (method, params, signal) => {
    const res = await call(method, params, signal);
    if (method === "a2a.tasks.list" && holding) {
      holding();
      holding = undefined;
      await gate;
    }
    return res;
  };
  const resyncing = w.wait({ signal: AbortSignal.timeout(10_000) });
  await held; // the resync has read the tasks; its answer waits
  for (let i = 0; i < 3; i++) sent.push((await p.send("w", text(`second ${i}`))).id);
  await until(() => delivered.n >= 6, 10_000, "the three new events reach w"); // two queued, the third dropped: overflow again
  release();
  take(await resyncing);
  // Every task sent, by the events queued and the resyncs due: a task
  // lost is waited for until the deadline.
  const deadline = AbortSignal.timeout(10_000);
  while (sent.some((id) => !seen.has(id))) {
    const ev = await w.wait({ signal: deadline }).catch(() => undefined);
    if (!ev) break;
    take(ev);
  }
  assert.deepEqual(
    sent.filter((id) => !seen.has(id)),
    [],
    "every task sent to the delegate reaches it, by an event or a resync",
  );
});

// Delegate.wait with several waiters: a resync item stays at the head of
// the queue while it is performed, so every waiter woken by the break
// performs it too and each returns a Resync with the same tasks: one
// broker restart, N resyncs, each waiter acting on the same `changed`
// tasks (and the later ones clear `overflow` in the `else` branch). A
// task event goes to exactly one waiter; a resync should too. Fix: claim
// the item (take it off the queue) when the resync starts, and put it
// back at the head if the resync fails. (runtime/delegate.go Wait shares it.)
//
// The waiters a resync does not wake stay waiting: once one has it, two
// tasks are sent, one for each of the others.
test("TestConcurrentWaitersGetOneResyncPerBreak [pipe]", async (t) => {
  const host = await openHost(t, "pipe");
  const w = await (await host.session("w")).spawn({ name: "w" });
  const p = await (await host.session("p")).spawn({ name: "p" });
  const signal = AbortSignal.timeout(20_000);
  const waits = [0, 1, 2].map(() =>
    w.wait({ signal }).then(
      (ev) => Object.keys(ev)[0],
      (e) => e.name,
    ),
  );
  await until(() => w.wakers.length === 3, 10_000, "the three wait");
  process.kill(host.brokerPid, "SIGKILL"); // a broker restart: one break
  await Promise.race(waits);
  for (let i = 0; i < 2; i++) await p.send("w", text(`after ${i}`));
  const got = await Promise.all(waits);
  assert.deepEqual(got.sort(), ["resync", "task", "task"], `one resync for one break, to one waiter; a task to each other`);
});

// Host.session racing Host.close on the pipe: close snapshots
// host.sessions; a session whose open was in flight (its replay already
// written, so the broker answers it before it exits) resolves afterwards,
// is added to the closed host's set and handed out as usable. (On NATS
// the same race rejects with ClosedError.) Fix: in Host.session, once
// Session.open resolves, leave it and throw ClosedError when the host
// closed meanwhile.
test("TestASessionOpenedWhileTheHostClosesIsNotHandedOut [pipe]", async (t) => {
  const host = await openHost(t, "pipe");
  const opening = host.session("late");
  await new Promise((r) => setImmediate(r)); // its calls are on the pipe
  const closing = host.close();
  const got = await opening.then(
    (s) => s,
    (e) => e,
  );
  await closing;
  assert.ok(got instanceof ClosedError, `a closed host hands out no session (got ${got?.constructor?.name})`);
  assert.equal(host.sessions.size, 0, "a closed host holds no session");
});
