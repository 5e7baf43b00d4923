import { lstat, readFile } from "node:fs/promises";
import { homedir } from "node:os";
import { join } from "node:path";

/** A connection file's content (docs/PROTOCOL.md §2.2). */
export interface ConnectionInfo {
  url: string;
  token?: string;
  pid: number;
  a2aUrl?: string;
  a2aToken?: string;
  /** The WebSocket listener for pages (serve --ws-listen), when it is on. */
  wsUrl?: string;
}

/**
 * Reads a broker's connection file, refusing (as every reader must) one
 * that is a symlink, not a regular file, or owned by another user.
 */
export async function readConnectionFile(path: string): Promise<ConnectionInfo> {
  const st = await lstat(path);
  if (st.isSymbolicLink()) throw new Error(`connection file ${path} is a symlink; refused`);
  if (!st.isFile()) throw new Error(`connection file ${path} is not a regular file; refused`);
  if (typeof process.getuid === "function" && st.uid !== process.getuid()) {
    throw new Error(`connection file ${path} is owned by another user; refused`);
  }
  const info = JSON.parse(await readFile(path, "utf8")) as ConnectionInfo;
  if (typeof info?.url !== "string" || info.url === "") throw new Error(`connection file ${path} has no url`);
  return info;
}

/**
 * The platform's state folder for a2a-bus, as serve finds it
 * (docs/PROTOCOL.md §2.2): `$XDG_STATE_HOME/a2a-bus` when that is set,
 * else `~/.local/state/a2a-bus` (Linux and other Unix),
 * `~/Library/Application Support/a2a-bus` (macOS),
 * `%LocalAppData%\a2a-bus` (Windows). The default data dir.
 */
export function defaultStateDir(): string {
  const xdg = process.env.XDG_STATE_HOME;
  if (xdg) return join(xdg, "a2a-bus");
  switch (process.platform) {
    case "darwin":
      return join(homedir(), "Library", "Application Support", "a2a-bus");
    case "win32":
      return join(process.env.LOCALAPPDATA || join(homedir(), "AppData", "Local"), "a2a-bus");
    default:
      return join(homedir(), ".local", "state", "a2a-bus");
  }
}

/**
 * Where serve writes its connection file by default (docs/PROTOCOL.md
 * §2.2): `$XDG_RUNTIME_DIR/a2a-bus/connection.json` when XDG_RUNTIME_DIR
 * is set and trusted (absent, or the user's own folder, no symlink, not
 * writable by group or others), else `connection.json` in the state
 * folder.
 */
export async function defaultConnectionFile(): Promise<string> {
  const runtime = process.env.XDG_RUNTIME_DIR;
  if (runtime && (await trustedRuntimeDir(runtime))) return join(runtime, "a2a-bus", "connection.json");
  return join(defaultStateDir(), "connection.json");
}

/** Whether serve would use dir as the runtime folder; Windows' owner check (an ACL) is serve's alone. */
async function trustedRuntimeDir(dir: string): Promise<boolean> {
  let st;
  try {
    st = await lstat(dir);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "ENOENT"; // made by serve, 0700
  }
  if (st.isSymbolicLink() || !st.isDirectory()) return false;
  if (process.platform === "win32") return true;
  if (typeof process.getuid === "function" && st.uid !== process.getuid()) return false;
  return (st.mode & 0o022) === 0;
}
