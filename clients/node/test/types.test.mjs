// The promises the declarations make, checked by the compiler against
// what `npm run build` wrote: test/types/compiles.ts must compile, and
// each line of the other files marked `// @ts-expect-error TSnnnn` must
// fail, with that error: a directive that no longer fails is itself an
// error for tsc, and a line that fails for another reason is caught by
// compiling the files again without the directives.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const ts = require("typescript");

const dir = fileURLToPath(new URL("types/", import.meta.url));
const directive = /^\s*\/\/ @ts-expect-error(.*)$/;

/** The test's program: the config's files, with the text of each as read(name) gives it. */
function program(read) {
  const config = ts.getParsedCommandLineOfConfigFile(join(dir, "tsconfig.json"), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: (d) => assert.fail(ts.flattenDiagnosticMessageText(d.messageText, "\n")) });
  const host = ts.createCompilerHost(config.options);
  const getSourceFile = host.getSourceFile.bind(host);
  host.getSourceFile = (name, lang, ...rest) => {
    const text = config.fileNames.includes(name) ? read(name) : undefined;
    return text === undefined ? getSourceFile(name, lang, ...rest) : ts.createSourceFile(name, text, lang);
  };
  return { files: config.fileNames, program: ts.createProgram(config.fileNames, config.options, host) };
}

test("TestTheTypesCompileAsPromised", async () => {
  const tsc = require.resolve("typescript/bin/tsc");
  const out = await new Promise((resolve) => {
    execFile(process.execPath, [tsc, "--noEmit", "-p", dir], (err, stdout, stderr) => resolve({ code: err ? err.code : 0, text: stdout + stderr }));
  });
  assert.equal(out.code, 0, `tsc --noEmit -p test/types:\n${out.text}`);
});

test("TestEachMarkedLineFailsWithItsError", () => {
  const want = new Map(); // "file:line" of the line after a directive -> its code
  const { files, program: p } = program((name) => {
    const lines = readFileSync(name, "utf8").split("\n");
    lines.forEach((l, i) => {
      const m = directive.exec(l);
      if (!m) return;
      const code = /^ (TS\d+)\b/.exec(m[1]);
      assert.ok(code, `${name}:${i + 1}: a directive names its error (// @ts-expect-error TSnnnn why)`);
      want.set(`${name}:${i + 2}`, code[1]);
      lines[i] = ""; // the directive gone, the line numbers kept
    });
    return lines.join("\n");
  });
  assert.ok(want.size >= 20, `the files mark the lines that must fail (${want.size})`);
  const got = new Map();
  for (const d of ts.getPreEmitDiagnostics(p)) {
    assert.ok(d.file && files.includes(d.file.fileName), `an error outside the test's files: ${ts.flattenDiagnosticMessageText(d.messageText, "\n")}`);
    const at = `${d.file.fileName}:${d.file.getLineAndCharacterOfPosition(d.start).line + 1}`;
    got.set(at, [...(got.get(at) ?? []), `TS${d.code}: ${ts.flattenDiagnosticMessageText(d.messageText, " ")}`]);
  }
  for (const [at, codes] of got) assert.ok(want.has(at), `${at} fails, and is not marked to: ${codes.join("; ")}`);
  for (const [at, code] of want) {
    const codes = got.get(at) ?? [];
    assert.ok(codes.some((c) => c.startsWith(`${code}:`)), `${at} must fail with ${code}; it ${codes.length ? `fails with ${codes.join("; ")}` : "compiles"}`);
  }
});
