// Sessions: isolation, a session the host closes, the caps and the
// error codes; the same scenarios as the Go host's and e2e tests
// (host/host_test.go, e2e/isolation_test.go), by name.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

import { A2ABusError, ClosedError, Codes, SettledError, isCode } from "../dist/index.js";
import { BUSES, next, openHost, text, checkLeaks, intercept } from "../testkit/helpers.mjs";

/** Records every notification a session's subscriptions receive, before the runtime filters anything. */
function recordSessions(host) {
  const got = new Map();
  intercept(host, (id) => {
    const seen = [];
    got.set(id, seen);
    return {
      deliver(n, put) {
        seen.push(n);
        return put(n);
      },
    };
  });
  return got;
}

async function rejectsWith(p, code) {
  await assert.rejects(p, (err) => {
    assert.ok(err instanceof A2ABusError, `${err} is an A2ABusError`);
    assert.equal(err.code, code);
    assert.equal(err.rpcCode, Codes[code]);
    return true;
  });
}

checkLeaks();

for (const bus of BUSES) {
  test(`TestASessionNeverReceivesAnotherSessionsEvent [${bus}]`, async (t) => {
    const host = await openHost(t, bus);
    const got = recordSessions(host);
    const ids = ["s1", "s2", "s 3/ü"]; // the last is base64url on NATS
    const pairs = [];
    for (const id of ids) {
      const s = await host.session(id);
      pairs.push([await s.spawn({ name: "asker" }), await s.spawn({ name: "worker" })]);
    }
    // Every session's pair works within the session, and across to the next one.
    for (let i = 0; i < pairs.length; i++) {
      const [asker, worker] = pairs[i];
      const [, nextWorker] = pairs[(i + 1) % pairs.length];
      const mine = await asker.send(worker.id, text(`in ${ids[i]}`));
      const across = await asker.send(nextWorker.id, text(`from ${ids[i]}`));
      await worker.update(mine.id, "completed");
      await nextWorker.update(across.id, "completed");
    }
    // Then a last task for each delegate, from its session's other one:
    // every event it heard is one it heard before that task's.
    const last = new Map();
    for (const [asker, worker] of pairs) {
      last.set(worker, await asker.send(worker.id, text("last")));
      last.set(asker, await worker.send(asker.id, text("last")));
    }
    for (const [d, end] of last) {
      for (let ev; (ev = await next(d)).task?.taskId !== end.id; ) {
        assert.ok(ev.task, "only task events");
        assert.equal(ev.task.recipient, d.id);
        assert.equal(ev.task.recipientContextId, d.sessionId);
        assert.ok([ev.task.task.requesterName, ev.task.task.agentName].includes(d.id), "a task it is a member of");
      }
    }
    // What reached each session's subscription, before any filtering.
    for (const id of ids) {
      const seen = got.get(id);
      assert.ok(seen.length >= 4, `session ${id} heard its own events`);
      for (const n of seen) assert.equal(n.params.recipientContextId, id, "never another session's event");
    }
  });

  test(`TestAClosedSessionEndsItsDelegates [${bus}]`, async (t) => {
    const host = await openHost(t, bus);
    const s1 = await host.session("s1");
    const s2 = await host.session("s2");
    const asker = await s1.spawn({ name: "asker" });
    const idle = await s1.spawn({ name: "idle" });
    const worker = await s2.spawn({ name: "worker" });
    const task = await asker.send("worker", text("job"));
    await next(worker);

    const waiting = assert.rejects(idle.wait(), SettledError, "a wait in progress ends");
    await s1.close();
    await waiting;
    await assert.rejects(asker.get(task.id), SettledError);
    await assert.rejects(s1.spawn({ name: "late" }), ClosedError);
    await s1.close(); // idempotent

    // Its delegates are deregistered: their tasks ended, the peer was told.
    const ev = await next(worker);
    assert.equal(ev.task.taskId, task.id);
    assert.equal(ev.task.task.status.state, "canceled");
    assert.deepEqual(await worker.peers(), []);
    if (bus === "nats") {
      const sessions = await host.callHost("a2a.admin.sessions");
      const s = sessions.sessions.find((x) => x.contextId === "s1");
      assert.ok(!s || s.subscribers === 0, "no connection of the closed session is left");
    }
    // The session id can be opened again, afresh.
    const again = await host.session("s1");
    const back = await again.spawn({ name: "asker" });
    assert.equal(back.id, "asker");
    await back.send("worker", text("hello again"));
    assert.equal((await next(worker)).task.task.requesterName, "asker");
  });

  test(`TestTheCapAndTheErrorCodes [${bus}]`, async (t) => {
    const host = await openHost(t, bus, { args: ["--max-tasks-per-context=2", "--max-agents-per-session=3"] });
    const s1 = await host.session("s1");
    const a = await s1.spawn({ name: "a" });
    await rejectsWith(a.send(text("anyone?")), "A2A_NO_PEERS");

    const s2 = await host.session("s2");
    const w = await s2.spawn({ name: "w" });
    const b = await s1.spawn({ name: "b" });
    const c = await s1.spawn({ name: "c" });
    await rejectsWith(s1.spawn({ name: "d" }), "A2A_AGENT_LIMIT");

    await assert.rejects(a.send(text("which?")), (err) => {
      assert.ok(isCode(err, "A2A_AMBIGUOUS_PEER"));
      assert.deepEqual(err.candidates, ["b", "c"]);
      return true;
    });
    await rejectsWith(a.send("nobody", text("hi")), "A2A_UNKNOWN_AGENT");
    await rejectsWith(a.send("a", text("me")), "INVALID_PARAMS");

    const t1 = await a.send("w", text("1"));
    const t2 = await b.send("w", text("2"));
    await rejectsWith(c.send("w", text("3")), "A2A_TASK_LIMIT"); // the cap is the session's, not the agent's
    // Membership, not session: c shares a's session and is still a stranger.
    await rejectsWith(c.get(t1.id), "A2A_UNKNOWN_AGENT");
    await rejectsWith(a.get(randomUUID()), "A2A_UNKNOWN_TASK");
    await rejectsWith(a.update(t1.id, "completed"), "A2A_INVALID_TRANSITION"); // the requester cannot update
    await w.update(t1.id, "completed");
    await rejectsWith(w.update(t1.id, "working"), "A2A_INVALID_TRANSITION"); // terminal
    await rejectsWith(w.cancel(t2.id), "A2A_INVALID_TRANSITION"); // only the requester cancels
    // A closed task frees its place under the cap.
    await c.send("w", text("3"));
  });
}
