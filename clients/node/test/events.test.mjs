// Delegate.events(): the async iterator over the queue wait reads. Its
// events are flat (kind, taskId, state, task, message, final); it ends
// when the delegate settles or its session or host closes, throws an
// AbortError when its signal aborts, and a reader that leaves it loses
// no event. Against a real broker on each bus.
import { test } from "node:test";
import assert from "node:assert/strict";

import { BUSES, next, openHost, text, checkLeaks, askerAndWorker, killBroker } from "../testkit/helpers.mjs";
import { EventStream } from "../dist/events.js";

checkLeaks();

/** Reads d's events in a loop until it ends; resolves with what it read. */
function drain(d, opts) {
  return (async () => {
    const seen = [];
    for await (const ev of d.events(opts)) seen.push(ev);
    return seen;
  })();
}

function isAbortError(cause) {
  return (err) => {
    assert.equal(err.name, "AbortError");
    assert.equal(err.code, "ABORT_ERR");
    assert.equal(err.cause, cause, "the signal's reason is the cause");
    return true;
  };
}

for (const bus of BUSES) {
  test(`TestEventsAreFlat [${bus}]`, async (t) => {
    const host = await openHost(t, bus);
    const asker = await (await host.session("s1")).spawn({ name: "asker" });
    const worker = await (await host.session("s2")).spawn({ name: "worker" });
    const signal = AbortSignal.timeout(15_000);
    const work = worker.events({ signal });
    const answers = asker.events({ signal });

    const task = await asker.send("worker", text("job"));
    const created = (await work.next()).value;
    assert.equal(created.kind, "created");
    assert.equal(created.taskId, task.id);
    assert.equal(created.state, "submitted");
    assert.equal(created.task.id, task.id);
    assert.equal(created.task.requesterName, "asker");
    assert.equal(created.message.parts[0].text, "job", "a created event's message is the one that created the task");
    assert.equal(created.message.from, "asker");
    assert.equal(created.final, false);
    // The notification itself, as wait returns it.
    assert.equal(created.event.kind, "created");
    assert.equal(created.event.recipient, "worker");
    assert.equal(created.event.recipientContextId, "s2");
    assert.equal(created.event.task, created.task);

    await worker.update(task.id, "working");
    const working = (await answers.next()).value;
    assert.equal(working.kind, "status");
    assert.equal(working.state, "working");
    assert.equal(working.final, false);
    assert.equal(working.message, undefined, "an update without a message has none");

    await worker.reply(task.id, text("which one?"));
    const asked = (await answers.next()).value;
    assert.equal(asked.kind, "message");
    assert.equal(asked.taskId, task.id);
    assert.equal(asked.state, "working");
    assert.equal(asked.message.parts[0].text, "which one?");
    assert.equal(asked.message.from, "worker");

    await worker.update(task.id, "completed", { message: text("done") });
    const done = (await answers.next()).value;
    assert.equal(done.kind, "status");
    assert.equal(done.state, "completed");
    assert.equal(done.task.status.state, "completed");
    assert.equal(done.final, true);
    assert.equal(done.message.parts[0].text, "done");

    await worker.push("asker", text("fyi"));
    const push = (await answers.next()).value;
    assert.equal(push.kind, "push");
    assert.equal(push.from, "worker");
    assert.equal(push.message.parts[0].text, "fyi");
    assert.equal(push.push.recipient, "asker");
    assert.equal(push.taskId, undefined);
    assert.equal(push.task, undefined);

    for (const it of [work, answers]) assert.deepEqual(await it.return(), { done: true, value: undefined });
  });

  test(`TestEventsTellAResync [${bus}]`, async (t) => {
    const host = await openHost(t, bus, { dataDir: "" });
    const { worker, task } = await askerAndWorker(host);
    const it = worker.events({ signal: AbortSignal.timeout(15_000) });
    const woke = it.next();
    await killBroker(host); // in memory: the open task is gone with it
    const { value: ev, done } = await woke;
    assert.equal(done, false);
    assert.equal(ev.kind, "resync");
    assert.deepEqual(ev.resync.lost, [task.id]);
    assert.deepEqual(ev.resync.changed, []);
    assert.equal(ev.taskId, undefined);
    await it.return();
  });

  test(`TestEventsEndWhenTheDelegateSettles [${bus}]`, async (t) => {
    const host = await openHost(t, bus);
    const { asker, worker, task } = await askerAndWorker(host);
    const it = asker.events();
    await worker.update(task.id, "completed");
    assert.equal((await it.next()).value.state, "completed");
    // The asker settles while a read waits: the read ends the stream.
    const reading = it.next();
    await asker.settle();
    assert.deepEqual(await reading, { done: true, value: undefined });
    // A loop begun after the settle ends at once.
    assert.deepEqual(await drain(asker), []);

    // A loop that settles its own delegate ends after that event.
    const again = await (await host.session("s3")).spawn({ name: "asker" });
    const second = await again.send("worker", text("another"));
    assert.equal((await next(worker)).task.taskId, second.id);
    await worker.update(second.id, "completed");
    const kinds = [];
    for await (const ev of again.events({ signal: AbortSignal.timeout(15_000) })) {
      kinds.push(ev.kind);
      if (ev.final) await again.settle();
    }
    assert.deepEqual(kinds, ["status"]);
  });

  test(`TestEventsEndWhenTheSessionOrHostCloses [${bus}]`, async (t) => {
    const host = await openHost(t, bus);
    const s1 = await host.session("s1");
    const s2 = await host.session("s2");
    const s3 = await host.session("s3");
    const closed = await s1.spawn({ name: "a" });
    const left = await s2.spawn({ name: "b" });
    const hosted = await s3.spawn({ name: "c" });
    const loops = [drain(closed), drain(left), drain(hosted)];
    await s1.close(); // settles its delegates
    await s2.leave(); // leaves them registered
    await host.close();
    // Each loop ended; none rejected.
    assert.deepEqual(await Promise.all(loops), [[], [], []]);
  });

  test(`TestEventsThrowAnAbortErrorWhenTheSignalAborts [${bus}]`, async (t) => {
    const host = await openHost(t, bus);
    const { asker, worker, task } = await askerAndWorker(host);

    const stop = new AbortController();
    const reason = new Error("the window closed");
    const reading = drain(asker, { signal: stop.signal });
    stop.abort(reason);
    await assert.rejects(reading, isAbortError(reason));

    // A signal aborted already: the first read throws.
    const gone = AbortSignal.abort();
    await assert.rejects(asker.events({ signal: gone }).next(), isAbortError(gone.reason));

    // A timeout's reason is its TimeoutError.
    await assert.rejects(drain(asker, { signal: AbortSignal.timeout(50) }), (err) => {
      assert.equal(err.name, "AbortError");
      assert.equal(err.cause?.name, "TimeoutError");
      return true;
    });

    // The delegate is as it was: its next event is there for the next reader.
    await worker.update(task.id, "completed");
    const ev = await next(asker);
    assert.equal(ev.task.taskId, task.id);
    assert.equal(ev.task.final, true);
  });

  test(`TestAReaderThatLeavesTheEventsLosesNone [${bus}]`, async (t) => {
    const host = await openHost(t, bus);
    const { asker, worker, task } = await askerAndWorker(host);
    const signal = AbortSignal.timeout(15_000);

    // A break after the first event: the second stays for wait.
    await worker.update(task.id, "working");
    await worker.update(task.id, "completed");
    for await (const ev of asker.events({ signal })) {
      assert.equal(ev.state, "working");
      break;
    }
    const ev = await next(asker);
    assert.equal(ev.task.task.status.state, "completed");

    // A read in progress ends with return, and takes nothing: the next
    // event goes to the next reader.
    const it = asker.events({ signal });
    const reading = it.next();
    assert.deepEqual(await it.return(), { done: true, value: undefined });
    assert.deepEqual(await reading, { done: true, value: undefined });
    assert.deepEqual(await it.next(), { done: true, value: undefined }, "an ended stream stays ended");
    const again = await asker.send("worker", text("again"));
    assert.equal((await next(worker)).task.taskId, again.id);

    // One queue: an event wait took is not read again by the iterator.
    await worker.update(again.id, "working");
    await worker.update(again.id, "completed");
    assert.equal((await next(asker)).task.task.status.state, "working");
    const { value } = await asker.events({ signal }).next();
    assert.equal(value.state, "completed");
  });
}

// The instant a read and return cross: the read had taken an event, from
// a queue that answers on command. It goes back to the queue, first in line.
test("TestAnEventReadAsTheStreamEndsIsPutBack", async () => {
  const given = [];
  let answer;
  const queue = {
    wait: () => new Promise((resolve) => (answer = resolve)),
    giveBack: (ev) => given.push(ev),
  };
  const stream = new EventStream(queue);
  const reading = stream.next();
  await new Promise((r) => setImmediate(r)); // the read is waiting
  const ev = { push: { recipient: "a", from: "b", message: { messageId: "m", parts: [{ kind: "text", text: "hi" }] } } };
  answer(ev);
  await stream.return(); // before the read resumes
  assert.deepEqual(await reading, { done: true, value: undefined });
  assert.deepEqual(given, [ev]);
});
