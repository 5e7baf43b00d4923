// The packages as npm would publish them: scripts/packages.mjs builds this
// platform's broker package and the main one, `npm pack` packs each, and
// `npm install` installs the two tarballs in a new folder (the registry
// gives the rest). There the README's quickstart runs as it is written,
// with no binary and no a2a-bus on PATH: Host.open starts the platform
// package's broker. `require` gets the same package. What does not
// depend on another step runs beside it: the two packs, and the three
// checks of the installed package.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, readFileSync, realpathSync, statSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { tempDir } from "../testkit/helpers.mjs";

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const platform = `${process.platform}-${process.arch}`;
const exe = process.platform === "win32" ? "a2a-bus.exe" : "a2a-bus";

/** Runs a command to its end; resolves with its stdout, rejects with its output when it fails. */
function run(cmd, args, opts = {}) {
  const npm = cmd === "npm" && process.platform === "win32";
  return new Promise((resolve, reject) => {
    execFile(npm ? "npm.cmd" : cmd, args, { encoding: "utf8", shell: npm, timeout: 300_000, maxBuffer: 64 << 20, ...opts }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${cmd} ${args.join(" ")}: ${err.message}\n${stdout}${stderr}`, { cause: err }));
      else resolve(stdout);
    });
  });
}

/** Packs the package in dir into dest; resolves with npm's account of the tarball. */
async function pack(dir, dest) {
  const [r] = JSON.parse(await run("npm", ["pack", dir, "--json", "--pack-destination", dest, "--loglevel=error"]));
  return { file: join(dest, r.filename), files: new Map(r.files.map((f) => [f.path, f])) };
}

test("TestThePackedPackagesRunTheQuickstartInANewFolder", { timeout: 600_000 }, async (t) => {
  const dir = tempDir(t);
  const out = join(dir, "npm");
  await run(process.execPath, [here("../scripts/packages.mjs"), "--out", out, "--platform", "current"]);
  const tgz = join(dir, "tgz");
  mkdirSync(tgz);
  const [main, broker] = await Promise.all([pack(join(out, "host"), tgz), pack(join(out, `host-${platform}`), tgz)]);

  // Each tarball holds what it needs and nothing else: no tests, no sources.
  const top = [...main.files.keys()].filter((f) => !f.startsWith("dist/")).sort();
  assert.deepEqual(top, ["LICENSE", "README.md", "package.json"]);
  for (const f of ["dist/index.js", "dist/index.d.ts", "dist/cjs/index.js", "dist/cjs/index.d.ts", "dist/cjs/package.json", "dist/self.cjs", "dist/browser.js", "dist/browser.d.ts", "dist/browser/a2a-bus.js"]) {
    assert.ok(main.files.has(f), `${f} is not in the package`);
  }
  assert.deepEqual([...broker.files.keys()].sort(), ["LICENSE", "README.md", `bin/${exe}`, "package.json"]);
  if (process.platform !== "win32") assert.equal(broker.files.get(`bin/${exe}`).mode & 0o111, 0o111);
  const manifest = JSON.parse(readFileSync(join(out, "host", "package.json"), "utf8"));
  assert.equal(manifest.optionalDependencies[`@a2a-bus/host-${platform}`], manifest.version);
  assert.equal(Object.keys(manifest.optionalDependencies).length, 6);
  assert.equal(manifest.scripts, undefined);
  assert.equal(manifest.devDependencies, undefined);
  const os = JSON.parse(readFileSync(join(out, `host-${platform}`, "package.json"), "utf8"));
  assert.deepEqual([os.os, os.cpu, os.version, os.license], [[process.platform], [process.arch], manifest.version, "Apache-2.0"]);

  // A new app installs the two tarballs; npm skips the other platforms' packages.
  const app = join(dir, "app");
  mkdirSync(app);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "quickstart", version: "1.0.0", private: true, type: "module" }));
  await run("npm", ["install", "--no-audit", "--no-fund", "--loglevel=error", main.file, broker.file], { cwd: app });
  const installed = realpathSync(join(app, "node_modules", "@a2a-bus", `host-${platform}`, "bin", exe));
  assert.ok(statSync(installed).isFile());

  // The README's quickstart, as written, then checks of what it did.
  const readme = readFileSync(here("../README.md"), "utf8");
  const quickstart = /```js\n([\s\S]*?)```/.exec(readme)[1];
  assert.doesNotMatch(quickstart, /binary/);
  writeFileSync(
    join(app, "quickstart.mjs"),
    quickstart +
      `
// The test's checks.
import assert from "node:assert/strict";
import { brokerBinary } from "@a2a-bus/host";
assert.equal(other.id, "discussant-2");
assert.ok(JSON.stringify(done).includes(task.id));
assert.ok(JSON.stringify(done).includes('"completed"'));
console.log(brokerBinary());
`,
  );
  // Its own home, state and runtime folders; a PATH with node alone.
  const home = join(dir, "home");
  mkdirSync(join(home, "run"), { recursive: true, mode: 0o700 });
  const env = {
    PATH: dirname(process.execPath),
    HOME: home,
    USERPROFILE: home,
    LOCALAPPDATA: join(home, "local"),
    XDG_STATE_HOME: join(home, "state"),
    XDG_RUNTIME_DIR: join(home, "run"),
  };
  if (process.env.SYSTEMROOT) env.SYSTEMROOT = process.env.SYSTEMROOT; // Windows needs it

  // The same package by require: its CommonJS build, finding the same broker.
  writeFileSync(
    join(app, "check.cjs"),
    `const { Host, brokerBinary } = require("@a2a-bus/host");
if (typeof Host.open !== "function") throw new Error("no Host.open");
console.log(brokerBinary());
`,
  );

  // TypeScript finds the types of each: an ES module's import, a CommonJS
  // require (node16: where require cannot load an ES module).
  writeFileSync(join(app, "esm.mts"), `import { Host, brokerBinary } from "@a2a-bus/host";\nconst b: string = brokerBinary();\nconst h: Promise<Host> = Host.open();\n`);
  writeFileSync(join(app, "cjs.cts"), `import host = require("@a2a-bus/host");\nconst b: string = host.brokerBinary();\nconst h: Promise<host.Host> = host.Host.open();\n`);
  const tsc = here("../node_modules/typescript/bin/tsc");
  const types = ["--types", "node", "--typeRoots", here("../node_modules/@types")];

  const [ran, required] = await Promise.all([
    run(process.execPath, ["quickstart.mjs"], { cwd: app, env, timeout: 60_000 }),
    run(process.execPath, ["check.cjs"], { cwd: app, env }),
    run(process.execPath, [tsc, "--noEmit", "--strict", "--module", "node16", ...types, "esm.mts", "cjs.cts"], { cwd: app }),
  ]);
  assert.equal(ran.trim(), installed);
  assert.equal(required.trim(), installed);
});
