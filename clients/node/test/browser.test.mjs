// The browser entry (@a2a-bus/host/browser) as a page gets it: nothing in
// its graph is Node's (esbuild bundles it for the browser platform, which
// fails on a Node built-in, and its sources use no Node global), its
// declarations compile with the DOM's library and no Node types, and the
// bundle the build wrote is the entry. What a page does with it, in a
// real browser against a real broker, e2e/browser_test.go tests; here,
// the host's side: Host.sessionCredentials.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";

import { bundle } from "../scripts/build.mjs";
import { RefusedError } from "../dist/index.js";
import { checkLeaks, openHost } from "../testkit/helpers.mjs";

checkLeaks();

const root = fileURLToPath(new URL("..", import.meta.url));
const require = createRequire(import.meta.url);

/** What a module a page loads must not use: Node's globals and timers' unref, and Node's types. */
const NODE_ONLY = [/\bprocess\./, /\bBuffer\b/, /\bsetImmediate\b/, /\.unref\(\)/, /\bNodeJS\./, /\brequire\(/, /\b__dirname\b/];

test("TestTheBrowserEntrysGraphHasNothingOfNodes", async () => {
  // Built for the browser platform: a Node built-in anywhere fails it.
  const res = await bundle(join(root, "dist", "browser", "check.js"), { write: false });
  assert.deepEqual(res.errors, []);
  const inputs = Object.keys(res.metafile.inputs);
  const ours = inputs.filter((f) => f.startsWith("src/"));
  for (const f of ["src/browser.ts", "src/runtime.ts", "src/feed.ts", "src/natslink.ts", "src/util.ts"]) assert.ok(ours.includes(f), `${f} is in the graph (${ours})`);
  for (const f of ["src/nats.ts", "src/host.ts", "src/pipe.ts", "src/health.ts"]) assert.ok(!ours.includes(f), `${f}, the Node host's, is not`);
  for (const f of ours) {
    const src = readFileSync(join(root, f), "utf8").replace(/^\s*(\/\/|\*|\/\*).*$/gm, ""); // code, not comments
    for (const re of NODE_ONLY) assert.doesNotMatch(src, re, `${f} uses ${re}`);
  }
  assert.ok(inputs.some((f) => f.includes("@nats-io/nats-core")), "the bundle carries nats-core");
});

test("TestTheBrowserEntrysDeclarationsNeedNoNodeTypes", () => {
  const ts = require("typescript");
  const dir = join(root, "test", "types-browser");
  const config = ts.getParsedCommandLineOfConfigFile(join(dir, "tsconfig.json"), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: (d) => assert.fail(ts.flattenDiagnosticMessageText(d.messageText, "\n")) });
  const program = ts.createProgram({ rootNames: config.fileNames, options: config.options });
  const told = ts.getPreEmitDiagnostics(program).map((d) => {
    const text = ts.flattenDiagnosticMessageText(d.messageText, " ");
    if (!d.file) return `TS${d.code}: ${text}`;
    const { line } = d.file.getLineAndCharacterOfPosition(d.start);
    return `${relative(root, d.file.fileName)}:${line + 1}: TS${d.code}: ${text}`;
  });
  assert.deepEqual(told, [], "tsc --noEmit -p test/types-browser");
  // It did read the package's declarations, and no Node types.
  const files = program.getSourceFiles().map((f) => relative(root, f.fileName));
  assert.ok(files.includes(join("dist", "browser.d.ts")), files.join(", "));
  assert.ok(!files.some((f) => f.includes("@types/node")), "no Node types in the program");
});

test("TestThePackageExportsTheEntryAndItsBundle", async () => {
  const pkg = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
  const entry = pkg.exports["./browser"].import;
  const bundled = pkg.exports["./browser/bundle"].import;
  for (const f of [entry.types, entry.default, bundled.types, bundled.default]) assert.ok(existsSync(join(root, f)), `${f} is built`);
  const code = readFileSync(join(root, bundled.default), "utf8");
  assert.doesNotMatch(code, /^\s*import\s|\bimport\s*\(|from\s*["'][^"'./]/m, "the bundle imports nothing: it is self-contained");
  // Both give the same names, with the API's functions among them.
  const [a, b] = await Promise.all([import("@a2a-bus/host/browser"), import("@a2a-bus/host/browser/bundle")]);
  assert.deepEqual(Object.keys(b).sort(), Object.keys(a).sort());
  for (const name of ["connectSession", "Session", "Delegate", "text", "isCode", "A2ABusError", "ClosedError", "subjectToken"]) {
    assert.equal(typeof b[name], "function", `the bundle exports ${name}`);
  }
  assert.equal(b.subjectToken("chat.2"), "~Y2hhdC4y"); // docs/PROTOCOL.md §2.2
  assert.deepEqual(b.text("x"), a.text("x"));
  await assert.rejects(b.connectSession({ contextId: "", credentials: () => ({}) }), (err) => err.name === "A2ABusError" && err.code === "INVALID_PARAMS");
  await assert.rejects(b.connectSession({ contextId: "chat-1" }), TypeError);
});

test("TestSessionCredentialsNameTheWebSocketListener", async (t) => {
  const host = await openHost(t, "nats", { args: ["--ws-listen", "127.0.0.1:0"] });
  const [a, b] = await Promise.all([host.sessionCredentials("chat-1"), host.sessionCredentials("chat-1")]);
  assert.match(a.wsUrl, /^ws:\/\/127\.0\.0\.1:\d+$/);
  assert.equal(a.wsUrl, host.bus.connection().wsUrl, "the listener of the connection file");
  assert.equal(a.url, host.bus.connection().url);
  assert.ok(a.user && a.password);
  assert.notEqual(a.password, b.password, "new on every call");
  await assert.rejects(host.sessionCredentials("a\nb"), (err) => err.code === "INVALID_PARAMS");
  await host.close();
  await assert.rejects(host.sessionCredentials("chat-1"), (err) => err.name === "ClosedError");
});

test("TestSessionCredentialsAreRefusedWithoutAWebSocketListener", async (t) => {
  const nats = await openHost(t, "nats");
  await assert.rejects(nats.sessionCredentials("chat-1"), (err) => {
    assert.ok(err instanceof RefusedError, `${err.name}: ${err.message}`);
    assert.match(err.message, /no WebSocket listener/);
    assert.match(err.message, /--ws-listen/);
    return true;
  });
  const pipe = await openHost(t, "pipe");
  await assert.rejects(pipe.sessionCredentials("chat-1"), RefusedError);
});
