// What a hostile review of the package found, each kept as a test: a dying
// pipe broker, oversized requests, a spawn racing a close, closed sessions
// held, session connections refused, notifications that are not objects.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { A2ABusError, ClosedError, UnavailableError } from "../dist/index.js";
import { BUSES, binary, countCalls, next, openHost, tempDir, text, checkLeaks } from "../testkit/helpers.mjs";

checkLeaks();

const dist = fileURLToPath(new URL("../dist/index.js", import.meta.url));

/** Runs a script in its own node process; resolves {code, out, hung} within ms. */
function runScript(t, source, ms) {
  const file = join(tempDir(t), "script.mjs");
  writeFileSync(file, source);
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [file], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, A2A_BUS_BINARY: binary() } });
    let out = "";
    p.stdout.on("data", (b) => (out += b));
    p.stderr.on("data", (b) => (out += b));
    let hung = false;
    const timer = setTimeout(() => {
      hung = true;
      p.kill("SIGKILL");
    }, ms);
    p.once("close", (code) => {
      clearTimeout(timer);
      resolve({ code, out, hung });
    });
  });
}

// PipeBus.rawCall: while the child object is still set but its
// stdin is no longer writable (an EPIPE after the broker died, before the
// child's "close" event), the call loops on `await raceAbort(this.childUp)`
// with childUp already resolved: a pure microtask loop. Timers and I/O
// never run again, so the child's "close" is never seen and the whole Node
// process freezes at 100% CPU.
test("TestACallWhileThePipeBrokerDiesDoesNotFreezeTheProcess [pipe]", async (t) => {
  const script = `
import { Host } from ${JSON.stringify(dist)};
const host = await Host.open({ bus: "pipe", binary: process.env.A2A_BUS_BINARY, dataDir: "", callTimeoutMs: 3000 });
const child = host.bus.child;
process.kill(host.brokerPid, "SIGKILL");
// The host keeps calling, as a busy runtime does, while the child dies:
// until the host has seen its end (what a frozen process never does).
while (host.bus.child === child) {
  host.callHost("a2a.events.replay", { contextId: "x" }).catch(() => {});
  await new Promise((r) => setImmediate(r));
}
await host.close();
console.log("done");
`;
  // The window is racy: try a few times; any freeze is the bug.
  const runs = await Promise.all([0, 1, 2, 3].map(() => runScript(t, script, 30_000)));
  for (const r of runs) assert.ok(!r.hung && /done/.test(r.out), `the process froze (killed after 30 s): ${r.out.slice(-300)}`);
});

// The same freeze, deterministically: a destroyed stdin is what Node makes
// of an EPIPE on it.
test("TestACallOnADeadPipeStdinDoesNotFreezeTheProcess [pipe]", async (t) => {
  const script = `
import { Host } from ${JSON.stringify(dist)};
const host = await Host.open({ bus: "pipe", binary: process.env.A2A_BUS_BINARY, dataDir: "", callTimeoutMs: 2000 });
host.bus.child.stdin.destroy();
const err = await host.callHost("a2a.events.replay", { contextId: "x" }).then(() => "answered", (e) => e.name);
await host.close();
console.log("done", err);
`;
  const r = await runScript(t, script, 30_000);
  assert.ok(!r.hung && /done/.test(r.out), `the process froze (killed after 30 s): ${r.out.slice(-300)}`);
});

// A request over the broker's message limit: on the pipe the
// broker answers -32600 with "id": null (docs/PROTOCOL.md §2.1), which
// PipeBus.onLine cannot match, so the call waits callTimeoutMs, fails as
// UnavailableError ("answer lost"), and Session.retry sends it again,
// attempts × callTimeoutMs in all. The Go client refuses it before
// sending (pipebus/client.go: transport.ErrTooLarge), not retried.
// At once: a call that waited for an answer would end as unavailable,
// and a retry would be a second attempt.
for (const bus of BUSES) {
  test(`TestAnOversizedChangeFailsAtOnceAndIsNotRetried [${bus}]`, async (t) => {
    const host = await openHost(t, bus, { retry: { attempts: 3, backoffMs: 10, maxBackoffMs: 10 } });
    const sends = countCalls(host, "a2a.message.send");
    const asker = await (await host.session("s1")).spawn({ name: "asker" });
    await (await host.session("s2")).spawn({ name: "worker" });
    const big = "x".repeat(bus === "pipe" ? 2 << 20 : 9 << 20); // over M on the pipe; over the NATS payload on NATS
    const err = await asker.send("worker", text(big)).then(
      () => undefined,
      (e) => e,
    );
    assert.ok(err, "the send is refused");
    assert.ok(!(err instanceof UnavailableError), `a request that can never go through is no lost answer (${err.name}: ${err.message.slice(0, 120)})`);
    assert.equal(sends.n, 1, "refused at once, not retried");
  });
}

// Session.end settles only the delegates in `live`; a spawn
// whose register call is in flight when the session closes is admitted
// false and settles itself, but by then the link is closed
// (PipeSession.call: ClosedError), so the registration stays on the
// broker: a live agent no one holds, occupying its name, listed by peers.
for (const bus of BUSES) {
  test(`TestASpawnRacingCloseLeavesNoAgentBehind [${bus}]`, async (t) => {
    const host = await openHost(t, bus);
    const s1 = await host.session("s1");
    const spawning = assert.rejects(s1.spawn({ name: "ghost" }), ClosedError);
    await s1.close();
    await spawning;
    const watcher = await (await host.session("s2")).spawn({ name: "watcher" });
    const peers = (await watcher.peers()).map((c) => c.agentId);
    assert.deepEqual(peers, [], "the spawn the close cut short was deregistered");
  });
}

// Host.session adds every Session to host.sessions and nothing
// ever removes it: a long-lived host that opens and closes chat sessions
// keeps every closed Session (its feed, delegates, queues) for ever.
test("TestAClosedSessionIsForgottenByItsHost [pipe]", async (t) => {
  const host = await openHost(t, "pipe");
  for (let i = 0; i < 5; i++) await (await host.session(`chat-${i}`)).close();
  assert.equal(host.sessions.size, 0, "closed sessions are not held by the host");
});

// NatsSessionLink.nc: when the host link is up but the session's
// own connection cannot be made (here: the server's cap of 16 connections
// per session; also a connect refused for any other lasting reason), the
// loop `catch { await sleep(50) }` retries for ever, asking
// a2a.sessions.open for a fresh credential every 50 ms: the call (here
// Host.session, which takes no deadline but its optional signal) never
// settles. Only A2ABusError and the caller's signal end it.
test("TestASessionConnectionThatIsRefusedFailsTheCall [nats]", async (t) => {
  const host = await openHost(t, "nats", { callTimeoutMs: 2000 });
  for (let i = 0; i < 16; i++) await host.session("same"); // the server allows 16 connections per session
  let opens = 0;
  const request = host.bus.request.bind(host.bus);
  host.bus.request = (nc, subject, method, ...rest) => {
    if (method === "a2a.sessions.open") opens++;
    return request(nc, subject, method, ...rest);
  };
  const outcome = await Promise.race([
    host.session("same").then(
      () => "opened",
      (e) => `failed: ${e.name}`,
    ),
    new Promise((r) => setTimeout(() => r("still pending after 30 s"), 30_000).unref()),
  ]);
  assert.match(outcome, /opened|failed/, `Host.session settles (${outcome}; ${opens} credentials asked for meanwhile)`);
});

// NatsSessionLink.subscribe queues m.json() as it is; Feed.take
// reads `n.params` of it, so a notification whose body is JSON `null`
// throws a TypeError out of Feed.next, and the pump fails every delegate
// of the session for good. The Go feed skips an undecodable notification
// (runtime/feed.go: take). (The pipe filters such lines in onLine.)
test("TestANullNotificationDoesNotEndTheSession [nats]", async (t) => {
  const host = await openHost(t, "nats");
  const asker = await (await host.session("s1")).spawn({ name: "asker" });
  const worker = await (await host.session("s2")).spawn({ name: "worker" });
  // Once flushed, the server has queued it to s1's connection: the event
  // the send below makes comes after it.
  host.bus.link.nc.publish("a2a.session.s1.events", new TextEncoder().encode("null"));
  await host.bus.link.nc.flush();
  const task = await worker.send("asker", text("still there?"));
  const ev = await next(asker);
  assert.equal(ev.task?.taskId, task.id);
});
