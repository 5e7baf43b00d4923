// The ADR 0162 scenario on each bus: the same scenarios as the Go
// host's tests (host/host_test.go), by name.
import { test } from "node:test";
import assert from "node:assert/strict";

import { SettledError } from "../dist/index.js";
import { BUSES, next, openHost, text, checkLeaks } from "../testkit/helpers.mjs";

checkLeaks();

for (const bus of BUSES) {
  test(`TestCrossSessionDiscoveryAndRoundTrip [${bus}]`, async (t) => {
    const host = await openHost(t, bus);
    const s1 = await host.session("chat-1");
    const s2 = await host.session("chat.2"); // not a plain subject token: "~Y2hhdC4y" on NATS
    const asker = await s1.spawn({ name: "discussant" });
    const other = await s2.spawn({ name: "discussant" });

    // Rule 4: names are unique on the host; the runtime adopts the id.
    assert.equal(asker.id, "discussant");
    assert.equal(other.id, "discussant-2");
    assert.match(other.prompt, /discussant-2 \(discussant was taken on this host\)/);
    assert.equal(other.registeredCard.contextId, "chat.2");

    // Rule 1: discovery is host-wide, each card with its session, never the caller.
    const peers = await asker.peers();
    assert.deepEqual(peers.map((c) => [c.agentId, c.contextId]), [["discussant-2", "chat.2"]]);

    // Rule 2: without `to`, the single other-session peer.
    const task = await asker.send(text("what do you think?"), { metadata: { topic: "naming" } });
    assert.equal(task.status.state, "submitted");
    assert.equal(task.agentName, "discussant-2");
    assert.equal(task.contextId, "chat-1");
    assert.equal(task.agentContextId, "chat.2");

    // Rule 5: the event carries the recipient's session and reaches it.
    const created = await next(other);
    assert.equal(created.task.kind, "created");
    assert.equal(created.task.taskId, task.id);
    assert.equal(created.task.recipientContextId, "chat.2");
    assert.equal(created.task.contextId, "chat-1");
    assert.equal(created.task.message.parts[0].text, "what do you think?");
    assert.equal(created.task.message.from, "discussant");

    await other.update(task.id, "working", { message: text("thinking") });
    const done = await other.update(task.id, "completed", {
      message: text("ship it"),
      artifacts: [{ name: "verdict", parts: [{ kind: "data", data: { ok: true } }] }],
    });
    assert.equal(done.status.state, "completed");
    assert.ok(done.artifacts[0].artifactId, "the broker fills in the artifact id");

    const working = await next(asker);
    assert.equal(working.task.task.status.state, "working");
    assert.equal(working.task.final, false);
    const final = await next(asker);
    assert.equal(final.task.kind, "status");
    assert.equal(final.task.final, true);
    assert.equal(final.task.recipientContextId, "chat-1");
    assert.equal(final.task.task.status.state, "completed");
    assert.equal(final.task.message.parts[0].text, "ship it");
    assert.deepEqual(final.task.task.artifacts[0].parts[0].data, { ok: true });

    // Task access is membership: both members read it.
    const seen = await other.get(task.id);
    assert.equal(seen.history.length, 3);
    assert.deepEqual(seen.metadata, { topic: "naming" });
    assert.equal((await asker.list({ role: "requester" })).length, 1);
  });

  test(`TestSameSessionDefaultPeer [${bus}]`, async (t) => {
    const host = await openHost(t, bus);
    const s1 = await host.session("s1");
    const s2 = await host.session("s2");
    const a = await s1.spawn({ name: "a" });
    const b = await s1.spawn({ name: "b" });
    await s2.spawn({ name: "c" });
    // Two candidates on the host, one in the session: the session's wins.
    const task = await a.send(text("hi"));
    assert.equal(task.agentName, "b");
    assert.equal((await next(b)).task.taskId, task.id);
  });

  test(`TestSettleDeregisters [${bus}]`, async (t) => {
    const host = await openHost(t, bus);
    const s1 = await host.session("s1");
    const s2 = await host.session("s2");
    const asker = await s1.spawn({ name: "asker" });
    const worker = await s2.spawn({ name: "worker" });
    const task = await asker.send("worker", text("job"));
    await next(worker);

    // A wait in progress ends with the settle.
    const waiting = assert.rejects(worker.wait(), SettledError);
    await worker.settle();
    await waiting;
    await assert.rejects(worker.get(task.id), SettledError);

    // Its open task failed, the requester was told, and it is gone from lists.
    const ev = await next(asker);
    assert.equal(ev.task.task.status.state, "failed");
    assert.equal(ev.task.final, true);
    assert.deepEqual(await asker.peers(), []);
  });

  test(`TestTasksFollowThePages [${bus}]`, async (t) => {
    const host = await openHost(t, bus, { args: ["--max-tasks-per-context=300"] });
    const s1 = await host.session("s1");
    const a = await s1.spawn({ name: "a" });
    const b = await s1.spawn({ name: "b" });
    const made = [];
    for (let i = 0; i < 130; i++) made.push((await a.send("b", text(`task ${i}`))).id);
    const listed = await a.list();
    assert.deepEqual(listed.map((x) => x.id), made, "every page, oldest first");
    assert.equal((await b.list({ role: "assignee", state: "submitted" })).length, 130);
    assert.equal((await b.list({ role: "requester" })).length, 0);
  });

  test(`TestADelegateHearsNothingOfTasksNotItsOwn [${bus}]`, async (t) => {
    const host = await openHost(t, bus);
    const s1 = await host.session("s1");
    const a = await s1.spawn({ name: "a" });
    const b = await s1.spawn({ name: "b" });
    const c = await s1.spawn({ name: "c" });
    await a.send("b", text("for b only"));
    assert.equal((await next(b)).task.recipient, "b");
    // Then one for c: had c heard of b's, that event would come first.
    const mine = await a.send("c", text("for c"));
    assert.equal((await next(c)).task.taskId, mine.id, "c is no member of b's task");
  });
}
