// Builds the package: dist/, the ES modules and their declarations (tsc
// with tsconfig.json), and dist/cjs/, the same modules as CommonJS for
// require() (tsc with tsconfig.cjs.json), in a folder whose package.json
// makes its files CommonJS. Their source maps carry the sources, as the
// package ships no src/.
//
//   node scripts/build.mjs [outDir]    outDir instead of dist
import { execFileSync } from "node:child_process";
import { rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));

export function build(outDir = join(root, "dist")) {
  const out = resolve(outDir);
  const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
  rmSync(out, { recursive: true, force: true });
  for (const [config, dir] of [
    ["tsconfig.json", out],
    ["tsconfig.cjs.json", join(out, "cjs")],
  ]) {
    execFileSync(process.execPath, [tsc, "-p", join(root, config), "--outDir", dir, "--inlineSources"], { cwd: root, stdio: "inherit" });
  }
  writeFileSync(join(out, "cjs", "package.json"), JSON.stringify({ type: "commonjs" }, null, 2) + "\n");
}

if (process.argv[1] === fileURLToPath(import.meta.url)) build(process.argv[2]);
