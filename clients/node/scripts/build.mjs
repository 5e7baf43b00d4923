// Builds the package: dist/, the ES modules and their declarations (tsc
// with tsconfig.json), and dist/cjs/, the same modules as CommonJS for
// require() (tsc with tsconfig.cjs.json), in a folder whose package.json
// makes its files CommonJS. Their source maps carry the sources, as the
// package ships no src/. The two compile at the same time, each in a
// process of its own; beside them esbuild writes dist/browser/a2a-bus.js,
// the browser entry (src/browser.ts) and everything it imports in one ES
// module, for a page that loads it without a bundler
// (@a2a-bus/host/browser/bundle). It builds for the browser platform, so
// a Node built-in anywhere in the entry's graph fails the build.
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
  await Promise.all([
    ...[
      ["tsconfig.json", out],
      ["tsconfig.cjs.json", join(out, "cjs")],
    ].map(([config, dir]) => run(process.execPath, [tsc, "-p", join(root, config), "--outDir", dir, "--inlineSources"], { cwd: root })),
    bundle(join(out, "browser", "a2a-bus.js")),
  ]);
  writeFileSync(join(out, "cjs", "package.json"), JSON.stringify({ type: "commonjs" }, null, 2) + "\n");
}

/**
 * Bundles the browser entry into outfile, one ES module with its source
 * map; with write false, resolves with esbuild's result (its metafile
 * says which inputs went in) and writes nothing. Rejects when the graph
 * needs anything a browser does not have.
 */
export async function bundle(outfile, { write = true } = {}) {
  const esbuild = await import("esbuild");
  return esbuild.build({
    entryPoints: [join(root, "src", "browser.ts")],
    outfile,
    write,
    bundle: true,
    format: "esm",
    platform: "browser",
    target: "es2022",
    minify: true,
    sourcemap: true,
    metafile: true,
    logLevel: "silent",
    legalComments: "eof",
    banner: { js: "/*! @a2a-bus/host/browser (Apache-2.0), with @nats-io/nats-core, @nats-io/nuid, @nats-io/nkeys (Apache-2.0) and tweetnacl (Unlicense) */" },
  });
}

/** Runs cmd to its end, its output this process's; rejects when it fails. */
export async function run(cmd, args, opts = {}) {
  const p = spawn(cmd, args, { stdio: "inherit", ...opts });
  const [code, signal] = await Promise.race([once(p, "close"), once(p, "error").then(([err]) => Promise.reject(err))]);
  if (code !== 0) throw new Error(`${cmd} ${args.join(" ")}: exited (${signal ?? code})`);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) await build(process.argv[2]);
