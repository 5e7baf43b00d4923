// The round trip from Node, beside bare nats.js on the same server, in one
// run: a delegate sends a task, the other waits for it and completes it,
// the first waits for the final event (two requests, two events), through
// the Node host package on each bus; and the same four messages bare on
// nats.js with a responder that only echoes, and one bare request/reply.
//
//   npm run build && node bench/roundtrip.mjs [--binary PATH] [--n 2000] [--json]
//
// --json prints one JSON object per case (the Go bench's Result shape:
// `go run ./bench --only node` runs this and puts the rows in
// docs/bench/results.md).
import { parseArgs } from "node:util";
import { PerformanceObserver } from "node:perf_hooks";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { connect } from "@nats-io/transport-node";

import { Host, text } from "../dist/index.js";

const { values: opt } = parseArgs({
  options: {
    binary: { type: "string", default: process.env.A2A_BUS_BINARY ?? "a2a-bus" },
    n: { type: "string", default: "2000" },
    json: { type: "boolean", default: false },
  },
});
const N = Number(opt.n);
const WARMUP = Math.min(200, N);

function stats(lat) {
  const s = [...lat].sort((a, b) => a - b);
  const at = (q) => s[Math.min(s.length - 1, Math.floor(q * s.length))];
  return { mean: lat.reduce((a, b) => a + b, 0) / lat.length, p50: at(0.5), p99: at(0.99) };
}

/**
 * Heap bytes allocated per call: the growth of the heap over small
 * batches that no garbage collection interrupted (the median of them).
 * Node counts no allocations, only bytes.
 */
async function heapPerOp(fn) {
  let gcs = 0;
  const obs = new PerformanceObserver((list) => (gcs += list.getEntries().length));
  obs.observe({ entryTypes: ["gc"] });
  const per = [];
  try {
    for (let batch = 0; batch < 40 && per.length < 15; batch++) {
      await new Promise((r) => setImmediate(r)); // let the observer report
      const before = gcs;
      const h0 = process.memoryUsage().heapUsed;
      for (let i = 0; i < 10; i++) await fn();
      const h1 = process.memoryUsage().heapUsed;
      await new Promise((r) => setImmediate(r));
      if (gcs === before && h1 > h0) per.push((h1 - h0) / 10);
    }
  } finally {
    obs.disconnect();
  }
  per.sort((a, b) => a - b);
  return per.length ? Math.round(per[Math.floor(per.length / 2)]) : 0;
}

async function measure(fn) {
  for (let i = 0; i < WARMUP; i++) await fn();
  const lat = new Array(N);
  for (let i = 0; i < N; i++) {
    const t0 = process.hrtime.bigint();
    await fn();
    lat[i] = Number(process.hrtime.bigint() - t0) / 1000; // µs
  }
  return { ...stats(lat), bytes: await heapPerOp(fn) };
}

/** The Node host's round trip on one bus; returns the stats and one event as sent. */
async function hostRoundTrip(bus, dir) {
  const host = await Host.open({
    bus,
    binary: opt.binary,
    connectionFile: bus === "nats" ? join(dir, bus, "connection.json") : undefined,
    dataDir: "", // memory, as the bare rows: not the platform's state folder
  });
  try {
    const asker = await (await host.session("bench-1")).spawn({ name: "asker" });
    const worker = await (await host.session("bench-2")).spawn({ name: "worker" });
    let sample;
    const once = async () => {
      const task = await asker.send("worker", text("take seat 2?"));
      const created = await worker.wait();
      if (created.task?.taskId !== task.id) throw new Error("the worker got another event");
      await worker.update(task.id, "completed");
      const final = await asker.wait();
      if (!final.task?.final) throw new Error("the asker got another event");
      sample ??= final.task;
    };
    const st = await measure(once);
    return { st, sample, info: host.bus.connection?.() };
  } finally {
    await host.close();
  }
}

/** Bare nats.js on the broker's server, with the host token. */
async function bare(info, eventBytes) {
  const pub = await connect({ servers: info.url, token: info.token });
  const sub = await connect({ servers: info.url, token: info.token });
  try {
    const enc = new TextEncoder();
    const event = enc.encode(eventBytes);
    const answer = enc.encode(JSON.stringify({ jsonrpc: "2.0", id: 1, result: { task: JSON.parse(eventBytes).params.task } })); // a task, as answered
    const send = enc.encode(`{"jsonrpc":"2.0","id":1,"method":"a2a.message.send","params":{"token":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","to":"assignee","message":{"role":"user","parts":[{"kind":"text","text":"take seat 2?"}]}}}`);
    const update = enc.encode(`{"jsonrpc":"2.0","id":2,"method":"a2a.tasks.update","params":{"token":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","taskId":"01929c6e-7f7c-7a10-9c7b-3f2f0a4d5e6f","state":"completed"}}`);
    const respond = (subject, notify) =>
      sub.subscribe(subject, {
        callback: (_, m) => {
          m.respond(answer);
          if (notify) sub.publish(notify, event);
        },
      });
    respond("bench.rr");
    respond("bench.send", "bench.events.assignee");
    respond("bench.update", "bench.events.requester");
    await sub.flush();
    const inbox = (subject) => {
      const s = pub.subscribe(subject);
      const it = s[Symbol.asyncIterator]();
      return () => it.next();
    };
    const toAssignee = inbox("bench.events.assignee");
    const toRequester = inbox("bench.events.requester");
    await pub.flush();
    const rr = await measure(async () => {
      JSON.parse(new TextDecoder().decode((await pub.request("bench.rr", send, { timeout: 5000 })).data)); // decoded, as the host's are
    });
    const dec = new TextDecoder();
    const four = await measure(async () => {
      JSON.parse(dec.decode((await pub.request("bench.send", send, { timeout: 5000 })).data));
      JSON.parse(dec.decode((await toAssignee()).value.data));
      JSON.parse(dec.decode((await pub.request("bench.update", update, { timeout: 5000 })).data));
      JSON.parse(dec.decode((await toRequester()).value.data));
    });
    return { rr, four };
  } finally {
    await pub.close();
    await sub.close();
  }
}

const dir = mkdtempSync(join(tmpdir(), "a2a-bus-bench-"));
try {
  const nats = await hostRoundTrip("nats", dir);
  const pipe = await hostRoundTrip("pipe", dir);
  // The sidecar is gone; start one more for the bare rows, on its server.
  const host = await Host.open({ bus: "nats", binary: opt.binary, connectionFile: join(dir, "bare", "connection.json"), dataDir: "" });
  let raw;
  try {
    raw = await bare(host.bus.connection(), JSON.stringify({ jsonrpc: "2.0", method: "a2a.task.event", params: nats.sample }));
  } finally {
    await host.close();
  }
  const rrName = "limit: request/reply raw, nats.js over TCP";
  const fourName = "limit: the round trip's four messages bare, nats.js over TCP";
  const row = (bus, name, st, against) => ({
    bus,
    case: name,
    nsPerOp: st.mean * 1000,
    allocsPerOp: -1,
    bytesPerOp: st.bytes,
    metrics: { "p50-µs": st.p50, "p99-µs": st.p99 },
    ...(against ? { ratio: st.p50 / against.st.p50, against: `${against.name} p50` } : {}),
  });
  const rows = [
    row("nats.js", rrName, raw.rr),
    row("nats.js", fourName, raw.four),
    row("node-nats", "node host: round trip, memory store", nats.st, { name: rrName, st: raw.rr }),
    row("node-nats", "node host: round trip, memory store", nats.st, { name: fourName, st: raw.four }),
    row("node-pipe", "node host: round trip, memory store", pipe.st, { name: rrName, st: raw.rr }),
  ];
  if (opt.json) {
    for (const r of rows) console.log(JSON.stringify(r));
  } else {
    console.log(`Node ${process.version}, ${N} round trips after ${WARMUP} to warm up.\n`);
    console.log("| bus | case | mean | p50 | p99 | heap B/op | ratio (p50) | against |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |");
    for (const r of rows) {
      const us = (v) => `${v.toFixed(1)} µs`;
      console.log(`| ${r.bus} | ${r.case} | ${us(r.nsPerOp / 1000)} | ${us(r.metrics["p50-µs"])} | ${us(r.metrics["p99-µs"])} | ${r.bytesPerOp} | ${r.ratio ? r.ratio.toFixed(2) : ""} | ${r.against ?? ""} |`);
    }
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
