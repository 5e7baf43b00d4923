// The events example of README.md runs as written, on each bus: the test
// takes the code block from the README and changes only the host's
// options (this checkout's binary, a broker that keeps its tasks in
// memory, a connection file of its own), never the platform's state
// folder or a broker already running.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { BUSES, binary, tempDir } from "../testkit/helpers.mjs";

const pkg = fileURLToPath(new URL("..", import.meta.url));

/** The first js block of the README's section titled heading. */
async function example(heading) {
  const readme = await readFile(join(pkg, "README.md"), "utf8");
  const at = readme.indexOf(`\n${heading}\n`);
  assert.ok(at >= 0, `README.md has a section ${heading}`);
  const block = /```js\n([\s\S]*?)```/.exec(readme.slice(at));
  assert.ok(block, `the section ${heading} has a js block`);
  return block[1];
}

/**
 * Runs the events example on bus, with before put ahead of it; resolves
 * with its output.
 */
async function runExample(t, bus, before = "") {
  const code = await example("### Events");
  const opts = { bus, binary: binary(), dataDir: "", connectionFile: join(tempDir(t), "connection.json") };
  const opened = /Host\.open\((\{[^)]*\})?\)/g;
  assert.equal(code.match(opened)?.length, 1, "the example opens one host");
  const run = before + code.replace(opened, (_, given) => `Host.open({ ...${given ?? "{}"}, ...${JSON.stringify(opts)} })`);
  // Run from the package's folder, so that "@a2a-bus/host" is this package.
  return new Promise((resolve, reject) => {
    execFile(process.execPath, ["--input-type=module", "-e", run], { cwd: pkg, timeout: 30_000 }, (err, stdout, stderr) =>
      err ? reject(Object.assign(err, { message: `${err.message}\n${stderr}` })) : resolve({ stdout, stderr }),
    );
  });
}

// The worker's answer is lost as the host closes (what happens when the
// asker hears the change before the worker hears its answer, and closes
// the host): the worker's update rejects with ClosedError once close has
// begun, as a call cut off by the close does.
const answerLostInTheClose = `
import { ClosedError as Closed$, Host as Host$ } from "@a2a-bus/host";
let closing$;
const closed$ = new Promise((r) => (closing$ = r));
const close$ = Host$.prototype.close;
Host$.prototype.close = function (...a) {
  closing$();
  return close$.apply(this, a);
};
const open$ = Host$.open;
Host$.open = async (...a) => {
  const host = await open$(...a);
  const session = host.bus.session.bind(host.bus);
  host.bus.session = (id) => {
    const link = session(id);
    const call = link.call.bind(link);
    link.call = async (method, ...rest) => {
      const res = await call(method, ...rest);
      if (method !== "a2a.tasks.update") return res;
      await closed$;
      throw new Closed$(\`\${method}: the answer was lost in the close (injected)\`);
    };
    return link;
  };
  return host;
};
`;

for (const bus of BUSES) {
  test(`TestTheReadmesEventsExampleRuns [${bus}]`, async (t) => {
    const { stdout, stderr } = await runExample(t, bus);
    assert.equal(stdout, "completed you asked: ship it?\n", stderr);
  });

  test(`TestTheReadmesEventsExampleEndsWellWhenTheCloseCutsAnAnswer [${bus}]`, async (t) => {
    const { stdout, stderr } = await runExample(t, bus, answerLostInTheClose);
    assert.equal(stdout, "completed you asked: ship it?\n", stderr);
  });
}
