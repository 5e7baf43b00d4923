// Opening a host: a broker that cannot start is a clear error at once.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";

import { Host } from "../dist/index.js";
import { BUSES, binary, checkLeaks, tempDir } from "../testkit/helpers.mjs";

checkLeaks();

for (const bus of BUSES) {
  test(`TestABrokerThatCannotStartIsAClearError [${bus}]`, async (t) => {
    const connectionFile = bus === "nats" ? join(tempDir(t), "c.json") : undefined;
    await assert.rejects(Host.open({ bus, binary: join(tempDir(t), "no-such-binary"), connectionFile }), /could not start: .*ENOENT/);
    await assert.rejects(
      Host.open({ bus, binary: binary(), connectionFile, args: ["--max-tasks-per-context=many"] }),
      /exited \(2\).*max-tasks-per-context/,
    );
  });
}

test("TestJoiningNeedsALiveBrokersFile [nats]", async (t) => {
  await assert.rejects(Host.open({ bus: "nats", connectionFile: join(tempDir(t), "missing.json") }), /ENOENT/);
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
const host = await Host.open({ bus: ${JSON.stringify(bus)}, binary: process.env.A2A_BUS_BINARY, connectionFile: ${JSON.stringify(join(dir, "c.json"))} });
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
    for (let i = 0; i < 100 && alive(pid); i++) await new Promise((r) => setTimeout(r, 50));
    assert.ok(!alive(pid), "the broker exited within 5 s of its host");
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
