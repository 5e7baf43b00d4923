// The wire types are generated from docs/schema/a2a-bus.schema.json,
// which a Go test keeps in step with the broker: they must be what the
// schema gives today.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";

import { generate } from "../scripts/gen-types.mjs";

test("TestTheTypesAreWhatTheSchemaGives", async () => {
  const now = await readFile(new URL("../src/wire.gen.ts", import.meta.url), "utf8");
  assert.equal(now, await generate(), "src/wire.gen.ts drifted from the schema: run npm run gen");
});
