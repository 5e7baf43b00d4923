// The Electron guide's main process (examples/electron-main.mjs), run by
// Node under a stand-in for the Electron calls it makes
// (testkit/electron/): it returns the delegate, its events reach the
// window that started it, its loops end without an unhandled rejection
// when a chat and then the host close, and quitting waits for
// host.close(). And the guide shows that file as it is.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdirSync, readFileSync, symlinkSync } from "node:fs";
import { delimiter, dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

import { binary, checkLeaks, tempDir } from "../testkit/helpers.mjs";

checkLeaks();

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const example = here("../examples/electron-main.mjs");

test("TestTheElectronGuideShowsTheExampleAsItIs", () => {
  const guide = readFileSync(here("../ELECTRON.md"), "utf8");
  assert.ok(guide.includes("```js\n" + readFileSync(example, "utf8") + "```\n"), "ELECTRON.md and examples/electron-main.mjs differ");
});

test("TestTheElectronExampleRunsUnderAStandIn", async (t) => {
  const dir = tempDir(t);
  // No platform package is installed here: the broker is the a2a-bus on PATH.
  const bin = join(dir, "bin");
  mkdirSync(bin);
  symlinkSync(binary(), join(bin, "a2a-bus"));
  const run = join(dir, "run");
  mkdirSync(run, { mode: 0o700 });
  const env = {
    ...process.env,
    PATH: [bin, dirname(process.execPath)].join(delimiter),
    XDG_RUNTIME_DIR: run, // serve's default connection file: not used
    XDG_STATE_HOME: join(dir, "state"), // serve's default data dir: not used
    ELECTRON_USER_DATA: join(dir, "userData"), // the app's: its data dir and connection file
    EXAMPLE: example,
  };
  const args = ["--import", pathToFileURL(here("../testkit/electron/register.mjs")).href, here("../testkit/electron/drive.mjs")];
  const r = await runNode(args, env, 60_000);
  assert.equal(r.hung, false, `the process did not end by itself after the quit:\n${r.out}\n${r.err}`);
  assert.equal(r.code, 0, r.err);
  assert.doesNotMatch(r.err, /unhandled/i);
  const seen = JSON.parse(r.out.trim().split("\n").at(-1));
  assert.equal(seen.first.id, "discussant");
  assert.equal(seen.second.id, "discussant-2");
  assert.equal(seen.prevented, 1);
});

/** Runs node with args; resolves {code, out, err, hung} within ms (killed then). */
function runNode(args, env, ms) {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, args, { env, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    p.stdout.on("data", (b) => (out += b));
    p.stderr.on("data", (b) => (err += b));
    let hung = false;
    const timer = setTimeout(() => {
      hung = true;
      p.kill("SIGKILL");
    }, ms);
    p.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, out, err, hung });
    });
  });
}
