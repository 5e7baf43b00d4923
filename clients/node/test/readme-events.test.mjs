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

for (const bus of BUSES) {
  test(`TestTheReadmesEventsExampleRuns [${bus}]`, async (t) => {
    const code = await example("### Events");
    const opts = { bus, binary: binary(), dataDir: "", connectionFile: join(tempDir(t), "connection.json") };
    const opened = /Host\.open\((\{[^)]*\})?\)/g;
    assert.equal(code.match(opened)?.length, 1, "the example opens one host");
    const run = code.replace(opened, (_, given) => `Host.open({ ...${given ?? "{}"}, ...${JSON.stringify(opts)} })`);
    // Run from the package's folder, so that "@a2a-bus/host" is this package.
    const { stdout, stderr } = await new Promise((resolve, reject) => {
      execFile(process.execPath, ["--input-type=module", "-e", run], { cwd: pkg, timeout: 30_000 }, (err, stdout, stderr) =>
        err ? reject(Object.assign(err, { message: `${err.message}\n${stderr}` })) : resolve({ stdout, stderr }),
      );
    });
    assert.equal(stdout, "completed you asked: ship it?\n", stderr);
  });
}
