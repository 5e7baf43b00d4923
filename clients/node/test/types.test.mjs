// The promises the declarations make, checked by the compiler against
// what `npm run build` wrote: test/types/compiles.ts must compile, and
// each line of the other files marked `// @ts-expect-error TSnnnn` must
// fail, with that error: a directive that no longer fails is itself an
// error for tsc, and a line that fails for another reason is caught by
// compiling the files again without the directives.
//
// The files are compiled as `tsc --noEmit -p test/types` does, once in
// all: every file checked, the declarations and the libraries included
// (most of the work). Compiled again without the directives, only the
// test's own files are checked again: the program reuses the rest, whose
// errors the directives, comments, cannot change.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const ts = require("typescript");

const dir = fileURLToPath(new URL("types/", import.meta.url));
const directive = /^\s*\/\/ @ts-expect-error(.*)$/;

/**
 * The test's program: the config's files, with the text of each as
 * read(name) gives it (as it is, when read is not given); every other
 * file as old has it, when given.
 */
function program(read, old) {
  const config = ts.getParsedCommandLineOfConfigFile(join(dir, "tsconfig.json"), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: (d) => assert.fail(ts.flattenDiagnosticMessageText(d.messageText, "\n")) });
  const host = ts.createCompilerHost(config.options);
  const getSourceFile = host.getSourceFile.bind(host);
  host.getSourceFile = (name, lang, ...rest) => {
    if (!config.fileNames.includes(name)) return old?.getSourceFile(name) ?? getSourceFile(name, lang, ...rest);
    return read ? ts.createSourceFile(name, read(name), lang) : getSourceFile(name, lang, ...rest);
  };
  const errors = ts.getConfigFileParsingDiagnostics(config);
  return { files: config.fileNames, errors, program: ts.createProgram({ rootNames: config.fileNames, options: config.options, host, oldProgram: old, configFileParsingDiagnostics: errors }) };
}

/** The files as they are, and every error of theirs, the declarations' and the libraries' included: what tsc reports. */
let asTheyAre;
function compiled() {
  if (!asTheyAre) {
    const { files, program: p } = program();
    asTheyAre = { files, program: p, diagnostics: ts.getPreEmitDiagnostics(p) };
  }
  return asTheyAre;
}

/** A diagnostic as tsc prints it. */
function told(d) {
  const text = ts.flattenDiagnosticMessageText(d.messageText, "\n");
  if (!d.file) return `TS${d.code}: ${text}`;
  const { line, character } = d.file.getLineAndCharacterOfPosition(d.start);
  return `${d.file.fileName}(${line + 1},${character + 1}): TS${d.code}: ${text}`;
}

test("TestTheTypesCompileAsPromised", () => {
  const { diagnostics } = compiled();
  assert.deepEqual(diagnostics.map(told), [], "tsc --noEmit -p test/types");
});

test("TestEachMarkedLineFailsWithItsError", () => {
  const base = compiled();
  // Outside the test's files: the errors of the files as they are.
  for (const d of base.diagnostics) {
    assert.ok(d.file && base.files.includes(d.file.fileName), `an error outside the test's files: ${told(d)}`);
  }
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
  }, base.program);
  assert.ok(want.size >= 20, `the files mark the lines that must fail (${want.size})`);
  const got = new Map();
  for (const d of files.flatMap((f) => ts.getPreEmitDiagnostics(p, p.getSourceFile(f)))) {
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
