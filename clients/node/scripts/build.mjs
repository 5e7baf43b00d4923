// Builds the package: dist/, the ES modules and their declarations (tsc
// with tsconfig.json), and dist/cjs/, the same modules as CommonJS for
// require() (tsc with tsconfig.cjs.json), in a folder whose package.json
// makes its files CommonJS. Their source maps carry the sources, as the
// package ships no src/. The two compile at the same time, each in a
// process of its own.
//
//   node scripts/build.mjs [outDir]    outDir instead of dist
import { spawn } from "node:child_process";
import { once } from "node:events";
import { rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));

export async function build(outDir = join(root, "dist")) {
  const out = resolve(outDir);
  const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
  rmSync(out, { recursive: true, force: true });
  await Promise.all(
    [
      ["tsconfig.json", out],
      ["tsconfig.cjs.json", join(out, "cjs")],
    ].map(([config, dir]) => run(process.execPath, [tsc, "-p", join(root, config), "--outDir", dir, "--inlineSources"], { cwd: root })),
  );
  writeFileSync(join(out, "cjs", "package.json"), JSON.stringify({ type: "commonjs" }, null, 2) + "\n");
}

/** Runs cmd to its end, its output this process's; rejects when it fails. */
export async function run(cmd, args, opts = {}) {
  const p = spawn(cmd, args, { stdio: "inherit", ...opts });
  const [code, signal] = await Promise.race([once(p, "close"), once(p, "error").then(([err]) => Promise.reject(err))]);
  if (code !== 0) throw new Error(`${cmd} ${args.join(" ")}: exited (${signal ?? code})`);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) await build(process.argv[2]);
