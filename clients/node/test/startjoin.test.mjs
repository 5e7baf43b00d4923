// How a host comes to its broker on NATS: by default it joins the one
// that runs (serve's default connection file, or the one it is given) and
// starts one only when none answers; two hosts opening together end on
// one broker. A host stops only a broker it started; a broker stopped
// cleanly leaves neither its connection file nor its lock. A broker that
// cannot start is a typed error.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { chmodSync, existsSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join } from "node:path";

import { BrokerRunningError, BrokerStartError, ForeignBrokerError, Host } from "../dist/index.js";
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

/** Writes a connection file at path (its folder made 0700), as a broker would. */
function writeConnectionFile(path, info) {
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  writeFileSync(path, JSON.stringify(info), { mode: 0o600 });
}

/** A listener on loopback that greets like a NATS server; counts who connects. */
async function fakeNats(t) {
  const seen = { connections: 0 };
  const server = createServer((sock) => {
    seen.connections++;
    sock.on("error", () => {});
    sock.end('INFO {"server_id":"fake","version":"2.10.0","max_payload":1048576}\r\n');
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  t.after(() => new Promise((r) => server.close(r)));
  return { port: server.address().port, seen };
}

/** The pid of a process that ran and exited. */
async function deadPid() {
  const p = spawn(process.execPath, ["-e", ""], { stdio: "ignore" });
  await once(p, "close");
  return p.pid;
}

// A connection file left by a broker that died (its pid runs no more),
// whose port something else now listens on: the host takes it for no
// broker and starts its own, never dialling that port.
test("TestAStaleConnectionFileIsNotJoined [nats]", async (t) => {
  const connectionFile = join(tempDir(t), "run", "connection.json");
  const fake = await fakeNats(t);
  const pid = await deadPid();
  writeConnectionFile(connectionFile, { url: `nats://127.0.0.1:${fake.port}`, token: "not-a-broker", pid });
  const host = await Host.open({ bus: "nats", binary: binary(), connectionFile, dataDir: "" });
  t.after(() => host.close());
  assert.equal(host.startedBroker, true, "it started its own broker");
  assert.notEqual(host.brokerPid, pid);
  assert.equal(fake.seen.connections, 0, "the port of a stale file is not dialled");
  await roundTrip(host, host, "stale");
});

// A connection file whose broker is not on loopback is none of this
// host's: refused with a typed error, by join and by start-or-join alike.
test("TestAConnectionFileNotOnLoopbackIsRefused [nats]", async (t) => {
  const connectionFile = join(tempDir(t), "run", "connection.json");
  writeConnectionFile(connectionFile, { url: "nats://192.0.2.1:4222", token: "elsewhere", pid: process.pid });
  for (const o of [{ broker: "join" }, { binary: binary(), dataDir: "" }]) {
    const err = await Host.open({ bus: "nats", connectionFile, ...o }).then(
      () => undefined,
      (e) => e,
    );
    assert.ok(err instanceof ForeignBrokerError, `${JSON.stringify(o)}: ${err?.name}: ${err?.message}`);
    assert.equal(err.code, "BROKER_FOREIGN");
    assert.equal(err.connectionFile, connectionFile);
    assert.match(err.message, /192\.0\.2\.1:4222, not on loopback; refused/);
  }
  assert.deepEqual(readdirSync(dirname(connectionFile)), ["connection.json"], "no broker was started in its place");
});

// A host given a data dir (and no connection file) keeps its broker's
// connection file in it: hosts on different data dirs (two apps) get a
// broker each, hosts on one (two instances of one app) share it.
test("TestAHostsDataDirHoldsItsConnectionFile [nats]", async (t) => {
  const places = freshPlaces(t);
  const { p: common } = await serve(t); // the user's own, at serve's default
  const [dirA, dirB] = [join(tempDir(t), "a"), join(tempDir(t), "b")];
  const open = async (dataDir) => {
    const h = await Host.open({ bus: "nats", binary: binary(), dataDir });
    t.after(() => h.close());
    return h;
  };
  const a1 = await open(dirA);
  const b = await open(dirB);
  const a2 = await open(dirA);
  assert.equal(a1.startedBroker, true);
  assert.equal(b.startedBroker, true);
  assert.notEqual(a1.brokerPid, b.brokerPid, "two data dirs, two brokers");
  assert.equal(a2.brokerPid, a1.brokerPid, "one data dir, one broker");
  assert.equal(a2.startedBroker, false);
  for (const h of [a1, b]) assert.notEqual(h.brokerPid, common.pid, "the broker at serve's default is not joined");
  assert.ok(existsSync(join(dirA, "connection.json")));
  assert.ok(existsSync(join(dirB, "connection.json")));
  assert.ok(existsSync(places.connectionFile), "serve's own file is left alone");
  await roundTrip(a1, a2, "shared");
});

// A host in memory (dataDir "") with no connection file starts a broker of
// its own, with its connection file in a private folder removed on close:
// it joins no durable broker it did not ask for.
test("TestAHostInMemoryStartsItsOwnBroker [nats]", async (t) => {
  freshPlaces(t);
  const { p: common } = await serve(t);
  const host = await Host.open({ bus: "nats", binary: binary(), dataDir: "" });
  let closed = false;
  t.after(() => (closed ? undefined : host.close()));
  assert.equal(host.startedBroker, true);
  assert.notEqual(host.brokerPid, common.pid);
  const file = /\((\/[^()]*connection\.json)\)$/.exec(host.describe())?.[1];
  assert.ok(file && existsSync(file), `its connection file: ${host.describe()}`);
  await host.close();
  closed = true;
  assert.ok(!existsSync(dirname(file)), "its private folder is removed on close");
  assert.ok(alive(common.pid));
});

/** A broker command that never says it is ready; it touches `started` when it runs. */
function silentBroker(t) {
  const dir = tempDir(t);
  const script = join(dir, "broker.sh");
  const started = join(dir, "started");
  writeFileSync(script, `#!/bin/sh\n: > '${started}'\nexec '${process.execPath}' -e 'setInterval(() => {}, 1 << 30)'\n`);
  chmodSync(script, 0o755);
  return { script, started };
}

// A sidecar that never prints its connection file's path is killed past
// the start timeout, and open fails with a BrokerStartError.
test("TestASidecarThatNeverSaysItIsReadyIsABrokerStartError [nats]", async (t) => {
  const { script } = silentBroker(t);
  const connectionFile = join(tempDir(t), "run", "connection.json");
  const err = await Host.open({ bus: "nats", binary: script, connectionFile, dataDir: "", startTimeoutMs: 300 }).then(
    () => undefined,
    (e) => e,
  );
  assert.ok(err instanceof BrokerStartError, `${err?.name}: ${err?.message}`);
  assert.equal(err.code, "BROKER_START_FAILED");
  assert.equal(err.signal, "SIGKILL");
  assert.match(err.message, /did not say it was ready within 300 ms/);
});

// A host whose joined broker went starts one of its own; one that never
// gets going does not hold up close: it is killed, and close resolves.
test("TestCloseDuringASidecarStartResolves [nats]", async (t) => {
  const { script, started } = silentBroker(t);
  const connectionFile = join(tempDir(t), "run", "connection.json");
  const { p: broker } = await serve(t, [`--connection-file=${connectionFile}`, "--data-dir="]);
  const host = await Host.open({ bus: "nats", binary: script, connectionFile, dataDir: "" });
  assert.equal(host.brokerPid, broker.pid);
  const events = record(host);
  broker.kill("SIGKILL");
  await events.next("brokerExit");
  const liveness = AbortSignal.timeout(20_000);
  while (!existsSync(started)) {
    assert.ok(!liveness.aborted, "the host did not start a sidecar");
    await new Promise((r) => setTimeout(r, 20));
  }
  await Promise.race([
    host.close(),
    new Promise((_, reject) => liveness.addEventListener("abort", () => reject(new Error("close did not resolve")))),
  ]);
});
