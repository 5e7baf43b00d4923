// How a host comes to its broker on NATS: by default it joins the one
// that runs (serve's default connection file, or the one it is given) and
// starts one only when none answers; two hosts opening together end on
// one broker. A host stops only a broker it started; a broker stopped
// cleanly leaves neither its connection file nor its lock. A broker that
// cannot start is a typed error.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";

import { BrokerRunningError, BrokerStartError, Host } from "../dist/index.js";
import { BUSES, binary, checkLeaks, next, tempDir, text, untilFinal } from "../testkit/helpers.mjs";
import { alive, freshPlaces, gone, record, serve } from "../testkit/broker.mjs";

checkLeaks();

/** A round trip between a delegate of a and one of b. */
async function roundTrip(a, b, tag) {
  const asker = await (await a.session(`${tag}-a`)).spawn({ name: `${tag}-asker` });
  const worker = await (await b.session(`${tag}-b`)).spawn({ name: `${tag}-worker` });
  const task = await asker.send(worker.id, text("work"));
  assert.equal((await next(worker)).task.taskId, task.id);
  await worker.update(task.id, "completed");
  assert.equal((await untilFinal(asker, task.id)).task.status.state, "completed");
}

// `a2a-bus serve` runs, as the top README suggests: a host given only its
// binary joins it, and leaves it running when it closes.
test("TestAHostJoinsTheRunningServe [nats]", async (t) => {
  const places = freshPlaces(t);
  const { p: broker, path } = await serve(t);
  assert.equal(path, places.connectionFile, "serve's default connection file is the one the host looks at");
  const host = await Host.open({ bus: "nats", binary: binary() });
  let closed = false;
  t.after(() => (closed ? undefined : host.close()));
  assert.equal(host.brokerPid, broker.pid, "the host is on the running broker");
  assert.equal(host.startedBroker, false);
  await roundTrip(host, host, "joined");
  await host.close();
  closed = true;
  assert.ok(alive(broker.pid), "a host that joined leaves the broker running");
  assert.ok(existsSync(path));

  // Its own clean stop removes the file and the lock beside it.
  broker.kill("SIGTERM");
  await gone(broker.pid);
  assert.deepEqual(readdirSync(dirname(path)), [], "no connection file, no lock file left");
});

// Two app instances open at once with nothing running: one starts the
// broker, the other finds it starting and joins it.
test("TestTwoHostsOpeningTogetherShareOneBroker [nats]", async (t) => {
  const places = freshPlaces(t);
  const hosts = await Promise.all([Host.open({ bus: "nats", binary: binary() }), Host.open({ bus: "nats", binary: binary() })]);
  const open = new Set(hosts);
  t.after(() => Promise.all([...open].map((h) => h.close())));
  const [a, b] = hosts;
  assert.ok(a.brokerPid > 0);
  assert.equal(a.brokerPid, b.brokerPid, "one broker");
  assert.deepEqual(hosts.map((h) => h.startedBroker).sort(), [false, true], "one host started it, the other joined");
  await roundTrip(a, b, "race");

  const starter = hosts.find((h) => h.startedBroker);
  const joiner = hosts.find((h) => !h.startedBroker);
  const pid = starter.brokerPid;
  await joiner.close();
  open.delete(joiner);
  assert.ok(alive(pid), "the joined host's close leaves the broker to its starter");
  await roundTrip(starter, starter, "after");
  await starter.close();
  open.delete(starter);
  await gone(pid);
  assert.deepEqual(readdirSync(dirname(places.connectionFile)), [], "the starter's close stops the broker: no connection file, no lock file left");
});

// The host that started the broker closes first: the one that joined it
// loses it, and, as it would at open, starts one of its own (on the same
// default data dir: the tasks are there) and goes on.
test("TestAJoinedHostStartsABrokerWhenItsStarterCloses [nats]", async (t) => {
  freshPlaces(t);
  const starter = await Host.open({ bus: "nats", binary: binary(), checkMs: 200 });
  let starterOpen = true;
  t.after(() => (starterOpen ? starter.close() : undefined));
  const joiner = await Host.open({ bus: "nats", binary: binary(), checkMs: 200 });
  t.after(() => joiner.close());
  assert.equal(joiner.startedBroker, false);
  const events = record(joiner);
  const asker = await (await joiner.session("j1")).spawn({ name: "asker" });
  const worker = await (await joiner.session("j2")).spawn({ name: "worker" });
  const task = await asker.send("worker", text("work across the handover"));
  assert.equal((await next(worker)).task.taskId, task.id);
  const waiting = untilFinal(asker, task.id);

  const old = starter.brokerPid;
  await starter.close();
  starterOpen = false;
  const exit = await events.next("brokerExit");
  assert.equal(exit.ev.pid, old);
  assert.equal(exit.ev.started, false, "it was not the joiner's");
  const rejoined = await events.next("rejoined");
  assert.equal(rejoined.ev.started, true, "the joiner started a broker of its own");
  assert.notEqual(rejoined.ev.pid, old);
  assert.equal(joiner.brokerPid, rejoined.ev.pid);
  assert.equal(joiner.startedBroker, true);

  const done = await worker.update(task.id, "completed");
  assert.equal(done.status.state, "completed", "the task survived the handover");
  assert.equal((await waiting).task.status.state, "completed");
});

// A host told to start its own broker while one runs is told so, with
// the connection file to join; a typed error.
test("TestStartingWhileABrokerRunsIsABrokerRunningError [nats]", async (t) => {
  const dir = tempDir(t);
  const connectionFile = join(dir, "run", "connection.json");
  const { p: broker } = await serve(t, [`--connection-file=${connectionFile}`, "--data-dir="]);
  const err = await Host.open({ bus: "nats", broker: "start", binary: binary(), connectionFile, dataDir: "" }).then(
    () => undefined,
    (e) => e,
  );
  assert.ok(err instanceof BrokerRunningError, `${err?.name}: ${err?.message}`);
  assert.ok(err instanceof BrokerStartError);
  assert.equal(err.code, "BROKER_RUNNING");
  assert.equal(err.connectionFile, connectionFile);
  assert.equal(err.pid, broker.pid);
  assert.equal(err.dataDir, false);
  assert.equal(err.exitCode, 1);
  assert.match(err.message, /a broker is already running/);
  // The same host, start-or-join (the default), joins it.
  const host = await Host.open({ bus: "nats", binary: binary(), connectionFile, dataDir: "" });
  t.after(() => host.close());
  assert.equal(host.brokerPid, broker.pid);
});

for (const bus of BUSES) {
  // Every way a broker fails to start is a BrokerStartError with a code and
  // what is known: the spawn's error as cause, or how it exited and what
  // it said.
  test(`TestAStartThatFailsIsATypedError [${bus}]`, async (t) => {
    const connectionFile = bus === "nats" ? join(tempDir(t), "c.json") : undefined;
    const missing = await Host.open({ bus, binary: join(tempDir(t), "no-such-binary"), connectionFile, dataDir: "" }).then(
      () => undefined,
      (e) => e,
    );
    assert.ok(missing instanceof BrokerStartError, `${missing?.name}: ${missing?.message}`);
    assert.equal(missing.code, "BROKER_START_FAILED");
    assert.equal(missing.cause?.code, "ENOENT", "the spawn's error is the cause");

    const silent = await Host.open({ bus, binary: "/bin/false", connectionFile, dataDir: "" }).then(
      () => undefined,
      (e) => e,
    );
    assert.ok(silent instanceof BrokerStartError, `${silent?.name}: ${silent?.message}`);
    assert.ok(!(silent instanceof BrokerRunningError));
    assert.equal(silent.code, "BROKER_START_FAILED");
    assert.equal(silent.exitCode, 1);
    assert.deepEqual(silent.output, []);
    assert.match(silent.message, /exited \(1\) before it was ready, and printed nothing/);

    const refused = await Host.open({ bus, binary: binary(), connectionFile, dataDir: "", args: ["--max-tasks-per-context=many"] }).then(
      () => undefined,
      (e) => e,
    );
    assert.ok(refused instanceof BrokerStartError);
    assert.equal(refused.exitCode, 2);
    assert.ok(refused.output.some((l) => /max-tasks-per-context/.test(l)), `what it said is kept: ${refused.output}`);
  });

  // A second broker on a data dir one holds: a BrokerRunningError that
  // says it is the data dir.
  test(`TestADataDirHeldIsABrokerRunningError [${bus}]`, async (t) => {
    const dataDir = tempDir(t);
    const first = await Host.open({ bus, binary: binary(), dataDir, connectionFile: bus === "nats" ? join(tempDir(t), "c.json") : undefined });
    t.after(() => first.close());
    const err = await Host.open({ bus, binary: binary(), dataDir, connectionFile: bus === "nats" ? join(tempDir(t), "c.json") : undefined }).then(
      () => undefined,
      (e) => e,
    );
    assert.ok(err instanceof BrokerRunningError, `${err?.name}: ${err?.message}`);
    assert.equal(err.dataDir, true);
    assert.equal(err.connectionFile, undefined);
  });
}

// A host that started its own broker with a connection file of its own
// leaves neither the file nor its lock when it closes.
test("TestAHostLeavesNoLockFile [nats]", async (t) => {
  const dir = join(tempDir(t), "run");
  const host = await Host.open({ bus: "nats", binary: binary(), connectionFile: join(dir, "connection.json"), dataDir: "" });
  assert.deepEqual(readdirSync(dir).sort(), ["connection.json", "connection.json.lock"]);
  await host.close();
  assert.deepEqual(readdirSync(dir), []);
});
