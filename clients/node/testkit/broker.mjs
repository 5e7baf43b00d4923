// Shared by the tests of how a host comes to its broker: serve run by
// hand, fresh default places for it, and what a host emits.
import { spawn } from "node:child_process";
import { once } from "node:events";
import { isAbsolute, join } from "node:path";
import { createInterface } from "node:readline";

import { binary, tempDir } from "./helpers.mjs";

/**
 * Runs `a2a-bus serve` with args, as a user or another app would; resolves
 * once it serves, with the process and its connection file's path. It is
 * killed when the test ends, if still there.
 */
export function serve(t, args = []) {
  return new Promise((resolve, reject) => {
    const p = spawn(binary(), ["serve", ...args], { stdio: ["ignore", "ignore", "pipe"] });
    t.after(async () => {
      if (p.exitCode === null && p.signalCode === null) {
        p.kill("SIGKILL");
        await once(p, "close");
      }
    });
    const lines = createInterface({ input: p.stderr });
    lines.once("line", (first) => (isAbsolute(first) ? resolve({ p, path: first }) : reject(new Error(first))));
    lines.on("line", () => {});
    p.once("error", reject);
  });
}

/**
 * Fresh places for serve's defaults, for this test: XDG_RUNTIME_DIR (its
 * connection file) and XDG_STATE_HOME (its data dir), which the brokers
 * started meanwhile inherit. Returns the default connection file's path.
 */
export function freshPlaces(t) {
  const runtime = tempDir(t);
  const state = tempDir(t);
  const was = { XDG_RUNTIME_DIR: process.env.XDG_RUNTIME_DIR, XDG_STATE_HOME: process.env.XDG_STATE_HOME };
  process.env.XDG_RUNTIME_DIR = runtime;
  process.env.XDG_STATE_HOME = state;
  t.after(() => {
    for (const [k, v] of Object.entries(was)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  });
  return { runtime, state, connectionFile: join(runtime, "a2a-bus", "connection.json") };
}

/** Whether process pid runs. */
export function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Waits until pid has exited (ms at most). */
export async function gone(pid, ms = 10_000) {
  for (const end = Date.now() + ms; alive(pid); ) {
    if (Date.now() > end) throw new Error(`process ${pid} still runs after ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * Records what host emits: `seen` in order, each as {name, ev, pid} (pid:
 * host.brokerPid as the event was emitted); next(name) resolves with the
 * next event of that name not yet taken.
 */
export function record(host) {
  const seen = [];
  const waiting = [];
  for (const name of ["brokerExit", "rejoined", "resync", "renamed", "lost"]) {
    host.on(name, (ev) => {
      const item = { name, ev, pid: host.brokerPid };
      seen.push(item);
      for (const w of waiting.splice(0)) w();
    });
  }
  const taken = new Set();
  return {
    seen,
    async next(name, ms = 20_000) {
      const end = Date.now() + ms;
      for (;;) {
        const item = seen.find((x) => x.name === name && !taken.has(x));
        if (item) {
          taken.add(item);
          return item;
        }
        if (Date.now() > end) throw new Error(`no ${name} event within ${ms} ms; saw ${seen.map((x) => x.name).join(", ") || "none"}`);
        await new Promise((r) => {
          waiting.push(r);
          setTimeout(r, 100);
        });
      }
    },
  };
}
