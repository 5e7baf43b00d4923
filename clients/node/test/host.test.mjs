// Opening a host: a broker that cannot start is a clear error at once.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";

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
