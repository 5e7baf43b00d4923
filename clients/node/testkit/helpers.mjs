// Shared by the scenarios: the a2a-bus binary, hosts on each bus, and
// waiting for what a delegate should see.
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { after } from "node:test";
import assert from "node:assert/strict";

import { Host, text } from "../dist/index.js";

export const BUSES = ["nats", "pipe"];

let built;
/** The binary to drive: A2A_BUS_BINARY, else one built from this checkout. */
export function binary() {
  if (process.env.A2A_BUS_BINARY) return process.env.A2A_BUS_BINARY;
  if (built) return built;
  const dir = mkdtempSync(join(tmpdir(), "a2a-bus-bin-"));
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  built = join(dir, "a2a-bus");
  const root = fileURLToPath(new URL("../../../", import.meta.url));
  execFileSync("go", ["build", "-o", built, "./cmd/a2a-bus"], { cwd: root, stdio: "inherit" });
  return built;
}

/** A temporary folder, removed when the test ends. */
export function tempDir(t) {
  const dir = mkdtempSync(join(tmpdir(), "a2a-bus-node-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * A host on the given bus that starts its own broker (a sidecar with its
 * own connection file on NATS), closed when the test ends. Its broker
 * keeps tasks in memory (dataDir ""), unless opts say otherwise: no test
 * uses the platform's state folder, or another test's data dir.
 */
export async function openHost(t, bus, opts = {}) {
  const dir = tempDir(t);
  const host = await Host.open({
    bus,
    binary: binary(),
    connectionFile: bus === "nats" ? join(dir, "run", "connection.json") : undefined,
    dataDir: "",
    checkMs: 200,
    callTimeoutMs: 10_000,
    ...opts,
  });
  t.after(() => host.close());
  return host;
}

/** The next event of d, within ms. */
export async function next(d, ms = 15_000) {
  return d.wait({ signal: AbortSignal.timeout(ms) });
}

/**
 * Waits until d hears that taskId is terminal, by an event or a resync;
 * returns the task as it heard it and what it saw on the way.
 */
export async function untilFinal(d, taskId, ms = 30_000) {
  const signal = AbortSignal.timeout(ms);
  const seen = [];
  for (;;) {
    const ev = await d.wait({ signal });
    seen.push(ev);
    if (ev.task?.taskId === taskId && ev.task.final) return { task: ev.task.task, event: ev.task, seen };
    const t = ev.resync?.changed.find((x) => x.id === taskId && isTerminal(x.status.state));
    if (t) return { task: t, seen };
  }
}

export function isTerminal(state) {
  return ["completed", "failed", "canceled", "rejected"].includes(state);
}

export { text, existsSync };

/**
 * Fails the file when a child process, socket or pipe outlives its tests:
 * every host closes what it started.
 */
export function checkLeaks() {
  const kinds = ["ProcessWrap", "TCPSocketWrap", "TCPWrap", "PipeWrap"];
  const count = () => {
    const n = {};
    for (const r of process.getActiveResourcesInfo()) if (kinds.includes(r)) n[r] = (n[r] ?? 0) + 1;
    return n;
  };
  const before = count(); // the process's own: its stdio to the test runner
  after(async () => {
    let now;
    for (const end = Date.now() + 10_000; Date.now() < end; ) {
      now = count();
      if (kinds.every((k) => (now[k] ?? 0) <= (before[k] ?? 0))) return;
      await new Promise((r) => setTimeout(r, 20)); // a close under way
    }
    assert.deepEqual(now, before, "handles left open after the tests");
  });
}

/**
 * Fault injection between the runtime and a real bus: the sessions the
 * host opens from now on go through wrap(id), which may replace `call`
 * (method, params, signal, next) and `deliver` (notification, next), the
 * handing of each received notification to the subscription's queue.
 */
export function intercept(host, wrap) {
  const open = host.bus.session.bind(host.bus);
  host.bus.session = (id) => {
    const link = open(id);
    const { call, deliver } = wrap(id) ?? {};
    return {
      get id() {
        return link.id;
      },
      close: (...a) => link.close(...a),
      call: call ? (method, params, signal) => call(method, params, signal, () => link.call(method, params, signal)) : (...a) => link.call(...a),
      async subscribe(signal) {
        const sub = await link.subscribe(signal);
        if (deliver) {
          const put = sub.queue.put.bind(sub.queue);
          sub.queue.put = (n) => deliver(n, put);
        }
        return sub;
      },
    };
  };
}

/**
 * Counts the calls of method that the sessions the host opens from now
 * on make, each retry included: returns {n}.
 */
export function countCalls(host, method) {
  const count = { n: 0 };
  intercept(host, () => ({
    call(m, params, signal, next) {
      if (m === method) count.n++;
      return next();
    },
  }));
  return count;
}

/**
 * The scene most fault tests start from: an asker in session s1 has sent
 * a job to a worker in session s2, which has heard of it.
 */
export async function askerAndWorker(host) {
  const asker = await (await host.session("s1")).spawn({ name: "asker" });
  const worker = await (await host.session("s2")).spawn({ name: "worker" });
  const task = await asker.send("worker", text("job"));
  await next(worker);
  return { asker, worker, task };
}

/** Kills the host's broker; resolves once the host has started another. */
export async function killBroker(host) {
  const pid = host.brokerPid;
  process.kill(pid, "SIGKILL");
  for (const end = Date.now() + 30_000; Date.now() < end; ) {
    const now = host.brokerPid;
    if (now !== undefined && now !== pid) return;
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error("the host did not start its broker again within 30 s");
}
