// Writes the packages to publish into npm/ (or --out), each a folder for
// `npm pack` or `npm publish`:
//
//   host-<platform>-<arch>/  the broker for one platform a desktop app ships
//       on, built from this Go module (CGO_ENABLED=0, so static; -trimpath,
//       stripped) as bin/a2a-bus (bin/a2a-bus.exe on Windows), with the
//       os and cpu that make npm install it on that platform only;
//   host/  @a2a-bus/host, built, listing those packages as optional
//       dependencies at its own version: Host.open starts the one npm
//       installed (brokerBinary()). The package.json beside this script
//       does not list them: they are on no registry until published, and
//       `npm ci` refuses a dependency its lockfile does not hold.
//
// Publish every host-* folder first, then host/, all at the same version.
// host/ is built while the brokers are (one after another).
//
//   node scripts/packages.mjs [--out DIR] [--platform P]...
//
// --platform: linux-x64, linux-arm64, darwin-x64, darwin-arm64, win32-x64,
// win32-arm64, or current (this machine's); repeated or comma-separated;
// default all six. host/ always lists all six.
import { copyFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import { build, run } from "./build.mjs";

const here = fileURLToPath(new URL("..", import.meta.url));
const moduleRoot = join(here, "..", "..");

/** Node's names (process.platform, process.arch) beside Go's (GOOS, GOARCH). */
export const PLATFORMS = {
  "linux-x64": { goos: "linux", goarch: "amd64", label: "Linux x64" },
  "linux-arm64": { goos: "linux", goarch: "arm64", label: "Linux arm64" },
  "darwin-x64": { goos: "darwin", goarch: "amd64", label: "macOS x64" },
  "darwin-arm64": { goos: "darwin", goarch: "arm64", label: "macOS arm64 (Apple silicon)" },
  "win32-x64": { goos: "windows", goarch: "amd64", label: "Windows x64" },
  "win32-arm64": { goos: "windows", goarch: "arm64", label: "Windows arm64" },
};

const main = JSON.parse(readFileSync(join(here, "package.json"), "utf8"));

/** The package name of a platform's broker. */
export const platformPackage = (platform) => `${main.name}-${platform}`;

/** The Go names of a platform, or an Error. */
function platformOf(platform) {
  const p = PLATFORMS[platform];
  if (!p) throw new Error(`unknown platform ${platform} (want one of ${Object.keys(PLATFORMS).join(", ")}, or current)`);
  return p;
}

/** Writes platform's package into out; resolves with its folder. */
export async function platformDir(out, platform) {
  const p = platformOf(platform);
  const [os, cpu] = platform.split("-");
  const dir = join(out, `host-${platform}`);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(join(dir, "bin"), { recursive: true });
  const exe = os === "win32" ? "a2a-bus.exe" : "a2a-bus";
  await run("go", ["build", "-trimpath", "-ldflags=-s -w", "-o", join(dir, "bin", exe), "./cmd/a2a-bus"], {
    cwd: moduleRoot,
    env: { ...process.env, CGO_ENABLED: "0", GOOS: p.goos, GOARCH: p.goarch },
  });
  const pkg = {
    name: platformPackage(platform),
    version: main.version,
    description: `The a2a-bus broker for ${p.label}, which ${main.name} starts.`,
    license: main.license,
    repository: main.repository,
    os: [os],
    cpu: [cpu],
    files: ["bin"],
    preferUnplugged: true,
  };
  writeFileSync(join(dir, "package.json"), JSON.stringify(pkg, null, 2) + "\n");
  writeFileSync(
    join(dir, "README.md"),
    `# ${pkg.name}\n\n` +
      `The [a2a-bus](https://github.com/a2a-bus/a2a-bus) broker, \`bin/${exe}\`, built for ${p.label}.\n\n` +
      `Install [${main.name}](https://www.npmjs.com/package/${main.name}), not this: it lists this package ` +
      `as an optional dependency, which npm installs on ${p.label} only, and \`Host.open\` starts the broker in it.\n`,
  );
  copyFileSync(join(here, "LICENSE"), join(dir, "LICENSE"));
  return dir;
}

/** Writes the main package, built, into out; resolves with its folder. */
export async function mainDir(out) {
  const dir = join(out, "host");
  rmSync(dir, { recursive: true, force: true });
  await build(join(dir, "dist"));
  const { scripts, devDependencies, ...pkg } = main;
  pkg.optionalDependencies = Object.fromEntries(Object.keys(PLATFORMS).map((p) => [platformPackage(p), main.version]));
  writeFileSync(join(dir, "package.json"), JSON.stringify(pkg, null, 2) + "\n");
  for (const f of ["README.md", "LICENSE"]) copyFileSync(join(here, f), join(dir, f));
  return dir;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({ options: { out: { type: "string" }, platform: { type: "string", multiple: true } } });
  const out = resolve(values.out ?? join(here, "npm"));
  let platforms = (values.platform ?? []).flatMap((p) => p.split(",")).map((p) => (p === "current" ? `${process.platform}-${process.arch}` : p));
  if (platforms.length === 0) platforms = Object.keys(PLATFORMS);
  platforms.forEach(platformOf); // all known before anything is built
  const brokers = async () => {
    const dirs = [];
    for (const p of platforms) dirs.push(await platformDir(out, p));
    return dirs;
  };
  const [dirs, main] = await Promise.all([brokers(), mainDir(out)]);
  for (const d of [...dirs, main]) console.log(d);
}
