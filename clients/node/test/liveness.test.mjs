// Liveness: a broker that is alive but stuck (SIGSTOP) is taken for dead
// after a health check goes unanswered, and replaced (a child or a
// sidecar the host started) or dialled again (a broker it joined); the
// waiting delegate completes. A host that was itself stopped kills no
// healthy broker. The same scenarios as the Go host's, against a real
// broker on each bus.
//
// The tests that block this process's event loop, or count its sockets,
// run first, one at a time; the stalls then run all at once: they share
// nothing, and wait on the brokers, not on the CPU. Each waits for what
// it expects (a broker stopped, then killed, a change completed, a check
// ended), under a generous deadline that fails it, never for a time.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { once } from "node:events";
import { existsSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";

import { Host, UnavailableError } from "../dist/index.js";
import { BUSES, askerAndWorker, binary, checkLeaks, next, openHost, tempDir, text, untilFinal } from "../testkit/helpers.mjs";

checkLeaks();

const pause = (ms) => new Promise((r) => setTimeout(r, ms));

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Sends sig to pid, if it is still there. */
function signal(pid, sig) {
  try {
    process.kill(pid, sig);
  } catch {
    // gone
  }
}

/**
 * Stops pid, and resolves once it is stopped: a SIGSTOP stops a process's
 * threads one by one as each next enters the kernel, and meanwhile one
 * may still answer. When the test ends pid is killed, if still there.
 */
async function stop(t, pid) {
  process.kill(pid, "SIGSTOP");
  t.after(() => signal(pid, "SIGKILL"));
  await waitFor(() => isStopped(pid), 10_000, `process ${pid} is stopped`);
}

/** Whether every thread of pid is stopped (Linux: /proc; elsewhere: ps). */
function isStopped(pid) {
  const tasks = `/proc/${pid}/task`;
  if (existsSync(tasks)) {
    return readdirSync(tasks).every((tid) => {
      try {
        // pid (comm) state ...: comm may hold spaces and parentheses.
        const stat = readFileSync(join(tasks, tid, "stat"), "utf8");
        return /^[tT]/.test(stat.slice(stat.lastIndexOf(")") + 2));
      } catch {
        return true; // the thread is gone
      }
    });
  }
  return /^T/.test(execFileSync("ps", ["-o", "state=", "-p", String(pid)], { encoding: "utf8" }).trim());
}

async function waitFor(cond, ms, what) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting until ${what}`);
    await pause(10);
  }
}

/** A logger that keeps what it is told. */
function recorder() {
  const lines = [];
  const at = (level) => (msg) => lines.push(`${level}: ${msg}`);
  return { lines, logger: { debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") }, decisions: () => lines.filter((l) => /taken for dead/.test(l)) };
}

/** A sidecar the test starts itself, as a desktop app's own broker would be: the host joins it. */
function sidecar(path, data) {
  return new Promise((resolve, reject) => {
    const p = spawn(binary(), ["serve", `--connection-file=${path}`, `--data-dir=${data}`], { stdio: ["ignore", "ignore", "pipe"] });
    const lines = createInterface({ input: p.stderr });
    lines.once("line", (first) => (first === path ? resolve(p) : reject(new Error(first))));
    lines.on("line", () => {});
    p.once("error", reject);
  });
}

/** Open TCP sockets of this process. */
function sockets() {
  return process.getActiveResourcesInfo().filter((r) => r === "TCPSocketWrap").length;
}

/** The watchdog of the broker the host is on (NATS: its link's; the pipe: its child's). */
function watchdog(host) {
  return host.bus.link?.dog ?? host.bus.dog;
}

for (const bus of BUSES) {
  // The host's own event loop blocked past the health deadline while it
  // checks the broker (as when the host is stopped then): the answer came
  // meanwhile and waits unread behind the deadline's timer. The broker is
  // not killed.
  test(`TestABlockedHostKillsNoHealthyBroker [${bus}]`, { timeout: 30_000 }, async (t) => {
    const log = recorder();
    let probing;
    const probed = new Promise((r) => (probing = r));
    const logger = {
      ...log.logger,
      debug(m) {
        log.logger.debug(m);
        if (/checking the broker/.test(m)) probing();
      },
    };
    const host = await openHost(t, bus, { healthTimeoutMs: 1000, logger });
    const pid = host.brokerPid;
    const dog = watchdog(host);
    process.kill(pid, "SIGSTOP");
    t.after(() => signal(pid, "SIGCONT"));
    await waitFor(() => isStopped(pid), 10_000, "the broker is stopped");
    const call = host.callHost("a2a.admin.info"); // stalls: after 1 s the broker is checked
    await probed;
    // The broker runs again, and this process does not, for 2.5 s; when
    // it does, its timers come before what it has to read.
    await new Promise((r) =>
      setImmediate(() => {
        process.kill(pid, "SIGCONT");
        const end = Date.now() + 2500;
        while (Date.now() < end);
        r();
      }),
    );
    await call;
    // The check is over: whatever it decided, it has decided.
    await waitFor(() => !dog.checking, 10_000, "the health check ends");
    assert.deepEqual(log.decisions(), [], "no broker is taken for dead");
    assert.equal(host.brokerPid, pid);
    assert.equal(host.rejoins, 0);
  });
}

// A broker the host joined, stopped with SIGSTOP: the host cannot kill
// it; it drops its connections and dials the connection file again,
// and a dial at the stopped broker (its port accepts, and never answers)
// neither hangs nor leaves a socket. Calls meanwhile end by their
// signal, or by callTimeoutMs. The app kills it and starts another on
// the same data dir: the host joins that, and the delegate completes.
// Not among the stalls below: it counts this process's sockets.
test("TestAStalledJoinedBrokerIsRejoined [nats]", { timeout: 60_000 }, async (t) => {
  const dir = tempDir(t);
  const path = join(dir, "run", "connection.json");
  const data = join(dir, "data");
  let broker = await sidecar(path, data);
  t.after(() => broker.kill("SIGKILL"));
  const log = recorder();
  const host = await Host.open({ bus: "nats", connectionFile: path, checkMs: 200, callTimeoutMs: 4000, healthTimeoutMs: 1000, logger: log.logger });
  t.after(() => host.close());
  const { asker, worker, task } = await askerAndWorker(host);
  const waiting = untilFinal(asker, task.id, 60_000);

  const t0 = Date.now();
  const stopped = broker;
  await stop(t, stopped.pid);
  await waitFor(() => /rejoining/.test(host.describe()), 10_000, "the host takes the stopped broker for gone");
  const detected = Date.now() - t0;

  // Both while the broker is stopped: a call with a signal ends with the
  // signal's reason; one without, at callTimeoutMs, as unavailable.
  const gaveUp = AbortSignal.timeout(1000);
  await Promise.all([
    assert.rejects(asker.get(task.id, { signal: gaveUp }), (err) => {
      assert.equal(err, gaveUp.reason, `the call ends by its signal: ${err?.name}: ${err?.message}`);
      return true;
    }),
    assert.rejects(host.callHost("a2a.admin.info"), (err) => {
      assert.ok(err instanceof UnavailableError, `${err?.name}: ${err?.message}`);
      assert.match(err.message, /within 4000 ms/, "the call ends at callTimeoutMs");
      return true;
    }),
  ]);
  // The dials that met the stopped broker left no socket.
  await waitFor(() => log.lines.some((l) => /^debug: rejoin: /.test(l)), 30_000, "a dial meets the stopped broker");
  assert.ok(sockets() <= 1, `${sockets()} sockets open while the broker is stopped`);

  stopped.kill("SIGKILL");
  await once(stopped, "close");
  const t2 = Date.now();
  broker = await sidecar(path, data);
  await worker.update(task.id, "completed");
  const rejoined = Date.now() - t2;
  assert.equal((await waiting).task.status.state, "completed");
  assert.equal(host.brokerPid, broker.pid);
  assert.equal(log.decisions().length, 1, `the decision is told once: ${log.decisions().join(" | ")}`);
  t.diagnostic(`taken for gone ${detected} ms after SIGSTOP; the task completed ${rejoined} ms after the new broker wrote its file`);
});

test("TestStalls", { concurrency: true, timeout: 120_000 }, async (t) => {
  const runs = [];
  for (const bus of BUSES) {
    // A pipe child, or a sidecar the host started, stopped with SIGSTOP
    // while a delegate waits on a task: killed and started again on the
    // same data dir; the task is completed on the new broker.
    runs.push(t.test(`TestAStalledBrokerIsReplaced [${bus}]`, { timeout: 60_000 }, async (t) => {
      const log = recorder();
      const host = await openHost(t, bus, { dataDir: tempDir(t), healthTimeoutMs: 1000, logger: log.logger });
      const { asker, worker, task } = await askerAndWorker(host);
      const waiting = untilFinal(asker, task.id);
      const pid = host.brokerPid;

      const t0 = Date.now();
      await stop(t, pid);
      await waitFor(() => !alive(pid), 15_000, "the stopped broker is killed");
      const killed = Date.now() - t0;
      const done = await worker.update(task.id, "completed", { message: text("done") });
      const updated = Date.now() - t0;
      assert.equal(done.status.state, "completed");
      const { task: heard, seen } = await waiting;
      assert.equal(heard.status.state, "completed");
      assert.ok(seen.some((ev) => ev.resync), "the asker resynced, as after a restart");
      assert.notEqual(host.brokerPid, pid, "a new broker");
      assert.ok(host.rejoins >= 1);
      assert.equal(log.decisions().length, 1, `the decision is told once: ${log.decisions().join(" | ")}`);
      t.diagnostic(`killed ${killed} ms after SIGSTOP (health deadline 1000 ms); the waiting task completed on the new broker ${updated} ms after`);
    }));
  }

  for (const bus of BUSES) {
    // The broker stopped, with a delegate waiting and a change made
    // during the stall, and continued only once that change completed:
    // the host does not wait out the stall, it replaces the broker
    // (default deadline, 5 s) and the change and the wait complete on the
    // new one while the old one is still stopped; SIGCONT finds the old
    // one gone, and the sessions go on. The change's deadline outlasts
    // the stall's detection and the restart (about 11 s with the default
    // health deadline): longer than the default 10 s.
    runs.push(t.test(`TestABrokerStoppedIsReplacedWhileItIsStopped [${bus}]`, { timeout: 60_000 }, async (t) => {
      const host = await openHost(t, bus, { dataDir: tempDir(t), callTimeoutMs: 30_000 });
      const { asker, worker, task } = await askerAndWorker(host);
      const waiting = untilFinal(asker, task.id, 60_000);
      const pid = host.brokerPid;
      const t0 = Date.now();
      await stop(t, pid);
      const done = await worker.update(task.id, "completed", { message: text("done") });
      const updated = Date.now() - t0;
      assert.equal(done.status.state, "completed");
      assert.notEqual(host.brokerPid, pid, "the change completed on a new broker");
      await waitFor(() => !alive(pid), 10_000, "the stopped broker is gone");
      signal(pid, "SIGCONT");
      assert.equal((await waiting).task.status.state, "completed");
      await goesOn(asker, worker);
      t.diagnostic(`the change made at the stall's start completed ${updated} ms after SIGSTOP, the old broker still stopped`);
    }));
  }

  for (const bus of BUSES) {
    // A broker stopped while the host makes no call at all: the idle check
    // (every 10 s) finds it.
    runs.push(t.test(`TestAnIdleHostFindsAStalledBroker [${bus}]`, { timeout: 60_000 }, async (t) => {
      const log = recorder();
      const host = await openHost(t, bus, { healthTimeoutMs: 1000, logger: log.logger });
      const pid = host.brokerPid;
      const t0 = Date.now();
      await stop(t, pid);
      await waitFor(() => !alive(pid), 25_000, "the stopped broker is killed");
      const killed = Date.now() - t0;
      await waitFor(() => host.brokerPid !== undefined && host.brokerPid !== pid, 10_000, "a new broker runs");
      assert.match(log.decisions().join(), /nothing was heard from it/);
      const info = await host.callHost("a2a.admin.info");
      assert.ok(info.epoch);
      t.diagnostic(`killed ${killed} ms after SIGSTOP, found by the idle check`);
    }));
  }

  // A broker the host joined, stopped, with a change made during the
  // stall, and continued once the host has taken it for gone and dialled
  // it in vain: the host dials until it answers again, and rejoins it.
  // The change has a deadline that outlasts the stall.
  runs.push(t.test("TestAJoinedBrokerStoppedThenContinuedIsRejoined [nats]", { timeout: 60_000 }, async (t) => {
    const dir = tempDir(t);
    const path = join(dir, "run", "connection.json");
    const broker = await sidecar(path, join(dir, "data"));
    t.after(() => broker.kill("SIGKILL"));
    const log = recorder();
    const host = await Host.open({ bus: "nats", connectionFile: path, checkMs: 200, callTimeoutMs: 30_000, logger: log.logger });
    t.after(() => host.close());
    const { asker, worker, task } = await askerAndWorker(host);
    const waiting = untilFinal(asker, task.id, 60_000);
    const t0 = Date.now();
    await stop(t, broker.pid);
    const update = worker.update(task.id, "completed", { message: text("done") });
    await waitFor(() => /rejoining/.test(host.describe()), 30_000, "the host takes the stopped broker for gone");
    await waitFor(() => log.lines.some((l) => /^debug: rejoin: /.test(l)), 30_000, "a dial meets the stopped broker");
    const stalled = Date.now() - t0;
    broker.kill("SIGCONT");
    assert.equal((await update).status.state, "completed");
    assert.equal((await waiting).task.status.state, "completed");
    const done = Date.now() - t0;
    assert.equal(host.brokerPid, broker.pid);
    assert.ok(host.rejoins >= 1, "the host took the stopped broker for gone, and joined it again");
    await goesOn(asker, worker);
    t.diagnostic(`stopped for ${stalled} ms; the change and the wait completed ${done - stalled} ms after SIGCONT`);
  }));

  for (const bus of BUSES) {
    // The host stopped (a laptop lid, a debugger) while it was checking
    // its broker, for three times its health deadline (the stop's length
    // is the scenario): when it runs again its deadline has long passed,
    // but the answer is there: the broker is not killed.
    runs.push(t.test(`TestAHostStoppedPastItsDeadlineKillsNoHealthyBroker [${bus}]`, { timeout: 60_000 }, async (t) => {
      const healthMs = 2000;
      const dir = tempDir(t);
      const script = join(dir, "host.mjs");
      const dist = new URL("../dist/index.js", import.meta.url).href;
      writeFileSync(
        script,
        `import { Host } from ${JSON.stringify(dist)};
import { createInterface } from "node:readline";
const say = (s) => process.stdout.write(s.replace(/\\n/g, " ") + "\\n");
const logger = { debug: (m) => say("debug: " + m), info: (m) => say("info: " + m), warn: (m) => say("warn: " + m), error: (m) => say("error: " + m) };
const host = await Host.open({ bus: ${JSON.stringify(bus)}, binary: process.env.A2A_BUS_BINARY, connectionFile: ${JSON.stringify(join(dir, "c.json"))}, dataDir: "", healthTimeoutMs: ${healthMs}, callTimeoutMs: 60000, logger });
const dog = host.bus.link?.dog ?? host.bus.dog;
say("ready " + host.brokerPid);
createInterface({ input: process.stdin }).on("line", async (cmd) => {
  if (cmd === "call") host.callHost("a2a.admin.info").then(() => say("answered"), (e) => say("failed " + e.message));
  if (cmd === "checked") {
    while (dog.checking) await new Promise((r) => setTimeout(r, 10));
    say("checked");
  }
  if (cmd === "state") say("state " + host.brokerPid + " " + host.rejoins);
  if (cmd === "close") { await host.close(); process.exit(0); }
});
`,
      );
      const p = spawn(process.execPath, [script], { stdio: ["pipe", "pipe", "inherit"], env: { ...process.env, A2A_BUS_BINARY: binary() } });
      t.after(() => signal(p.pid, "SIGKILL"));
      const said = [];
      const heard = (re) =>
        new Promise((resolve) => {
          const check = () => {
            const l = said.find((x) => re.test(x));
            if (l) {
              lines.off("line", check);
              resolve(l);
            }
          };
          lines.on("line", check);
          check();
        });
      const lines = createInterface({ input: p.stdout });
      lines.on("line", (l) => said.push(l));
      const pid = Number((await heard(/^ready /)).split(" ")[1]);
      t.after(() => signal(pid, "SIGKILL"));

      // The broker stalls; a call waits on it past the deadline; the host checks it.
      await stop(t, pid);
      p.stdin.write("call\n");
      await heard(/^debug: checking the broker/);
      // Now the host stops, and the broker answers while it does not run.
      p.kill("SIGSTOP");
      await waitFor(() => isStopped(p.pid), 10_000, "the host is stopped");
      process.kill(pid, "SIGCONT");
      await pause(3 * healthMs);
      p.kill("SIGCONT");
      assert.equal(await heard(/^(answered|failed)/), "answered", "the call is answered");
      p.stdin.write("checked\n"); // the check is over: whatever it decided, it has decided
      await heard(/^checked$/);
      p.stdin.write("state\n");
      const [, nowPid, rejoins] = (await heard(/^state /)).split(" ");
      assert.equal(Number(nowPid), pid, "the same broker");
      assert.ok(alive(pid));
      if (bus === "pipe") assert.equal(Number(rejoins), 0);
      assert.deepEqual(said.filter((l) => /taken for dead/.test(l)), [], "no broker is taken for dead");
      p.stdin.write("close\n");
      await once(p, "close");
    }));
  }
  await Promise.all(runs);
});

/** The sessions go on: a round trip each way. */
async function goesOn(asker, worker) {
  const again = await asker.send("worker", text("next"));
  let ev = await next(worker);
  while (ev.resync || ev.task?.taskId !== again.id) ev = await next(worker);
  await worker.update(again.id, "completed");
  const { task } = await untilFinal(asker, again.id);
  assert.equal(task.status.state, "completed");
}
