// The package as a dependency sees it: its license, its two builds (ES
// modules and CommonJS) with the same exports, and how it finds the
// broker when given no binary (brokerBinary: the platform package's,
// from app.asar.unpacked in a packaged Electron app, else PATH's).
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, readFileSync, realpathSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import * as esm from "../dist/index.js";
import { findBinary, outOfAsar } from "../dist/binary.js";
import { tempDir } from "../testkit/helpers.mjs";

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
  assert.equal(cjs.brokerBinary(), esm.brokerBinary());
  assert.equal(JSON.parse(readFileSync(here("../dist/cjs/package.json"), "utf8")).type, "commonjs");
});

/** A node_modules with the main package and, when given, a platform's package. */
function tree(root, platform) {
  const mod = join(root, "node_modules", "@a2a-bus");
  const self = join(mod, "host", "dist", "self.cjs");
  mkdirSync(join(mod, "host", "dist"), { recursive: true });
  writeFileSync(join(mod, "host", "package.json"), JSON.stringify({ name: "@a2a-bus/host", version: "0.1.0" }));
  writeFileSync(self, "");
  if (platform) {
    const dir = join(mod, `host-${platform}`);
    mkdirSync(join(dir, "bin"), { recursive: true });
    writeFileSync(join(dir, "package.json"), JSON.stringify({ name: `@a2a-bus/host-${platform}`, version: "0.1.0" }));
    writeFileSync(join(dir, "bin", platform.startsWith("win32") ? "a2a-bus.exe" : "a2a-bus"), "");
  }
  return self;
}

test("TestTheBrokerIsThePlatformPackagesElseTheOneOnPath", (t) => {
  const dir = realpathSync(tempDir(t)); // as require.resolve gives paths
  const self = tree(join(dir, "app"), "linux-x64");
  const pkg = join(dir, "app", "node_modules", "@a2a-bus", "host-linux-x64");
  assert.equal(findBinary(self, "linux", "x64"), join(pkg, "bin", "a2a-bus"));
  assert.equal(findBinary(self, "linux", "arm64"), "a2a-bus"); // no package for it
  const win = tree(join(dir, "win"), "win32-arm64");
  assert.equal(findBinary(win, "win32", "arm64"), join(dir, "win", "node_modules", "@a2a-bus", "host-win32-arm64", "bin", "a2a-bus.exe"));
});

test("TestAPackagedElectronAppStartsTheBrokerOutsideItsArchive", (t) => {
  const dir = realpathSync(tempDir(t)); // as require.resolve gives paths
  const asar = join(dir, "Resources", "app.asar");
  const self = tree(asar, "darwin-arm64"); // a folder here, an archive in Electron: resolved alike
  const unpacked = join(dir, "Resources", "app.asar.unpacked", "node_modules", "@a2a-bus", "host-darwin-arm64", "bin");
  assert.throws(() => findBinary(self, "darwin", "arm64"), (err) => {
    assert.equal(err.name, "BrokerStartError");
    assert.equal(err.code, "BROKER_START_FAILED");
    assert.match(err.message, /inside an asar archive/);
    assert.match(err.message, /asarUnpack/);
    assert.ok(err.message.includes(join(unpacked, "a2a-bus")));
    return true;
  });
  mkdirSync(unpacked, { recursive: true });
  writeFileSync(join(unpacked, "a2a-bus"), "");
  assert.equal(findBinary(self, "darwin", "arm64"), join(unpacked, "a2a-bus"));
});

test("TestOutOfAsarMapsOnlyAPathInsideAnArchive", () => {
  assert.equal(outOfAsar("/a/app.asar/node_modules/x/bin/a2a-bus"), "/a/app.asar.unpacked/node_modules/x/bin/a2a-bus");
  assert.equal(outOfAsar("C:\\A\\resources\\app.asar\\node_modules\\x\\bin\\a2a-bus.exe"), "C:\\A\\resources\\app.asar.unpacked\\node_modules\\x\\bin\\a2a-bus.exe");
  assert.equal(outOfAsar("/a/app.asar.unpacked/x"), "/a/app.asar.unpacked/x");
  assert.equal(outOfAsar("/a/node_modules/x/bin/a2a-bus"), "/a/node_modules/x/bin/a2a-bus");
});
