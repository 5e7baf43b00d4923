// Opening a host: a broker that cannot start is a clear error at once.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";

import { BrokerStartError, Host } from "../dist/index.js";
import { BUSES, binary, checkLeaks, tempDir, openHost, next, text, untilFinal } from "../testkit/helpers.mjs";

checkLeaks();

for (const bus of BUSES) {
  test(`TestABrokerThatCannotStartIsAClearError [${bus}]`, async (t) => {
    const connectionFile = bus === "nats" ? join(tempDir(t), "c.json") : undefined;
    await assert.rejects(Host.open({ bus, binary: join(tempDir(t), "no-such-binary"), connectionFile, dataDir: "" }), /could not start: .*ENOENT/);
    await assert.rejects(
      Host.open({ bus, binary: binary(), connectionFile, dataDir: "", args: ["--max-tasks-per-context=many"] }),
      /exited \(2\).*max-tasks-per-context/,
    );
  });
}

test("TestJoiningNeedsALiveBrokersFile [nats]", async (t) => {
  // A failure to reach a broker is typed, with what failed as its cause.
  await assert.rejects(Host.open({ bus: "nats", connectionFile: join(tempDir(t), "missing.json") }), (err) => {
    assert.ok(err instanceof BrokerStartError, `${err.name}: ${err.message}`);
    assert.equal(err.code, "BROKER_START_FAILED");
    assert.match(err.message, /ENOENT/);
    assert.equal(err.cause?.code, "ENOENT");
    return true;
  });
});

test("TestAnUnknownBusIsRefused", async () => {
  await assert.rejects(Host.open({ bus: "carrier-pigeon" }), /unknown bus "carrier-pigeon"/);
});

for (const bus of BUSES) {
  // A sidecar dies with its host, even one killed with no chance to close it.
  test(`TestTheBrokerDiesWithItsHost [${bus}]`, async (t) => {
    const dir = tempDir(t);
    const script = join(dir, "host.mjs");
    const dist = new URL("../dist/index.js", import.meta.url).href;
    writeFileSync(
      script,
      `import { Host } from ${JSON.stringify(dist)};
const host = await Host.open({ bus: ${JSON.stringify(bus)}, binary: process.env.A2A_BUS_BINARY, connectionFile: ${JSON.stringify(join(dir, "c.json"))}, dataDir: "" });
console.log(host.brokerPid);
setInterval(() => {}, 1000);
`,
    );
    const p = spawn(process.execPath, [script], { stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, A2A_BUS_BINARY: binary() } });
    const [line] = await once(createInterface({ input: p.stdout }), "line");
    const pid = Number(line);
    assert.ok(pid > 0 && alive(pid), "the broker runs");
    p.kill("SIGKILL");
    await once(p, "close");
    for (const end = Date.now() + 30_000; alive(pid) && Date.now() < end; ) await new Promise((r) => setTimeout(r, 20));
    assert.ok(!alive(pid), "the broker exits after its host (30 s at most)");
  });
}

for (const bus of BUSES) {
  // One data dir, one broker: a second host that would start its own on
  // it is refused, and told what to do instead.
  test(`TestASecondBrokerOnOneDataDirIsRefused [${bus}]`, async (t) => {
    const dataDir = tempDir(t);
    const first = await openHost(t, bus, { dataDir });
    await assert.rejects(
      Host.open({ bus, binary: binary(), dataDir, connectionFile: bus === "nats" ? join(tempDir(t), "c.json") : undefined }),
      (err) => {
        assert.match(err.message, /the data directory is held by another running broker/);
        assert.match(err.message, /join it with its connection file .* or give this host its own dataDir/);
        return true;
      },
    );
    // The first is unharmed.
    const s = await first.session("s1");
    await s.spawn({ name: "still-here" });
  });

  // A host that says nothing of a data dir keeps its broker's tasks and
  // registrations in the platform's state folder (here: XDG_STATE_HOME, a
  // temporary one): a restart loses neither the task nor the name.
  test(`TestAHostKeepsItsTasksInTheStateFolderByDefault [${bus}]`, async (t) => {
    const state = tempDir(t);
    const was = process.env.XDG_STATE_HOME;
    process.env.XDG_STATE_HOME = state; // the broker, and the one started after it dies, inherit it
    t.after(() => {
      if (was === undefined) delete process.env.XDG_STATE_HOME;
      else process.env.XDG_STATE_HOME = was;
    });
    const host = await openHost(t, bus, { dataDir: undefined });
    const asker = await (await host.session("s1")).spawn({ name: "asker" });
    const worker = await (await host.session("s2")).spawn({ name: "worker" });
    const task = await asker.send("worker", text("job"));
    await next(worker);
    assert.ok(existsSync(join(state, "a2a-bus", "tasks")), "the store is in the state folder");

    const waiting = untilFinal(asker, task.id);
    process.kill(host.brokerPid, "SIGKILL");
    const done = await worker.update(task.id, "completed");
    assert.equal(done.status.state, "completed", "the task survived the restart");
    assert.equal(worker.id, "worker", "the worker got its name back");
    const { seen } = await waiting;
    const resync = seen.find((ev) => ev.resync)?.resync;
    assert.ok(resync, "the asker was told of the break");
    assert.deepEqual(resync.lost, [], "no work was lost");
  });
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
