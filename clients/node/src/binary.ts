import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

import { selfFile } from "./self.cjs";
import { BrokerStartError } from "./errors.js";

/**
 * The a2a-bus broker a host starts when it is given no `binary`:
 *
 * 1. the one in this platform's package, `@a2a-bus/host-<platform>-<arch>`
 *    (`@a2a-bus/host-linux-x64`, `@a2a-bus/host-darwin-arm64`,
 *    `@a2a-bus/host-win32-x64`, ...): an optional dependency of this
 *    package, which npm installs for the running platform only, holding
 *    `bin/a2a-bus` (`bin/a2a-bus.exe` on Windows);
 * 2. else `a2a-bus`, found on PATH when it starts.
 *
 * In a packaged Electron app that package is inside `app.asar`, where no
 * binary can be run: the same path under `app.asar.unpacked` is returned,
 * and an Error when the package was not unpacked there (electron-builder
 * `asarUnpack`, Electron Forge `packagerConfig.asar.unpack`).
 */
export function brokerBinary(): string {
  return findBinary(selfFile, process.platform, process.arch);
}

/**
 * @internal brokerBinary for a package resolved from the file `from` on the
 * platform and arch given.
 */
export function findBinary(from: string, platform: string, arch: string): string {
  const pkg = `@a2a-bus/host-${platform}-${arch}`;
  let dir: string;
  try {
    dir = dirname(createRequire(from).resolve(`${pkg}/package.json`));
  } catch {
    return "a2a-bus"; // no package for this platform: the one on PATH
  }
  const file = join(dir, "bin", platform === "win32" ? "a2a-bus.exe" : "a2a-bus");
  const unpacked = outOfAsar(file);
  if (unpacked === file || existsSync(unpacked)) return unpacked;
  throw new BrokerStartError(
    `the a2a-bus binary ${file} is inside an asar archive, where it cannot be run, and ${unpacked} does not exist: ` +
      `unpack ${pkg} when packaging the app (electron-builder: "asarUnpack": ["**/node_modules/@a2a-bus/host-*/**"]; ` +
      `Electron Forge: packagerConfig.asar.unpack "**/node_modules/@a2a-bus/host-*/**")`,
  );
}

/**
 * The path of a file inside an Electron asar archive (`.../app.asar/...`)
 * in the folder its unpacked files go to (`.../app.asar.unpacked/...`);
 * any other path as it is.
 */
export function outOfAsar(file: string): string {
  return file.replace(/(\.asar)(?=[\\/])/g, "$1.unpacked");
}
