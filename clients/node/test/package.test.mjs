// The package as a dependency sees it: its license, and its two builds
// (ES modules and CommonJS) with the same exports.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

import * as esm from "../dist/index.js";

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const require = createRequire(import.meta.url);

test("TestThePackageCarriesTheRepositorysApacheLicense", () => {
  const pkg = JSON.parse(readFileSync(here("../package.json"), "utf8"));
  assert.equal(pkg.license, "Apache-2.0");
  assert.equal(pkg.private, undefined);
  const license = readFileSync(here("../LICENSE"), "utf8");
  assert.equal(license, readFileSync(here("../../../LICENSE"), "utf8"));
  assert.match(license, /Apache License\s+Version 2\.0, January 2004/);
});

test("TestRequireGetsACommonJSBuildWithTheSameExports", () => {
  const cjs = require("@a2a-bus/host"); // the package by its own name: its exports' "require"
  assert.equal(require.resolve("@a2a-bus/host"), here("../dist/cjs/index.js"));
  assert.deepEqual(Object.keys(cjs).filter((k) => k !== "__esModule").sort(), Object.keys(esm).sort());
  assert.equal(typeof cjs.Host.open, "function");
  assert.ok(new cjs.ClosedError("x") instanceof Error);
  assert.equal(JSON.parse(readFileSync(here("../dist/cjs/package.json"), "utf8")).type, "commonjs");
});
