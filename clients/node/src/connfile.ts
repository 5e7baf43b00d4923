import { lstat, readFile } from "node:fs/promises";

/** A connection file's content (docs/PROTOCOL.md §2.2). */
export interface ConnectionInfo {
  url: string;
  token?: string;
  pid: number;
  a2aUrl?: string;
  a2aToken?: string;
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
