// Runs the Electron example (the file EXAMPLE names) under the stand-in,
// as its renderers and its user would: chats start delegates over IPC,
// delegates the example returns send and answer, a chat closes, the app
// quits. Asserts along the way; prints what it saw as one JSON line.
// Run with `node --import ./register.mjs drive.mjs`, ELECTRON_USER_DATA,
// XDG_RUNTIME_DIR and XDG_STATE_HOME set to folders of the test's own.
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

import { app, stub } from "electron";
import { ClosedError, Delegate, text } from "@a2a-bus/host";

process.on("unhandledRejection", (err) => {
  console.error("unhandled rejection:", err);
  process.exitCode = 1;
});

const example = await import(pathToFileURL(process.env.EXAMPLE).href);
const has = (ev, ...words) => words.every((w) => JSON.stringify(ev).includes(w));

// Two chat windows start a delegate each, by name.
const chat1 = stub.sender();
const chat2 = stub.sender();
const first = await stub.invoke("a2a:start", chat1, "chat-1", "discussant");
const second = await stub.invoke("a2a:start", chat2, "chat-2", "discussant");
assert.equal(first.id, "discussant");
assert.equal(second.id, "discussant-2");
assert.match(second.prompt, /discussant-2/);

// startDelegate returns the delegate itself, whose events still flow
// (here into stand-in senders, which keep them and can wait for one).
const ends = [];
const askerEvents = stub.sender();
const asker = await example.startDelegate("chat-3", "asker", {
  onEvent: (ev) => askerEvents.send("event", ev),
  onEnd: (err) => ends.push(["asker", err]),
});
assert.ok(asker instanceof Delegate);
const workerEvents = stub.sender();
const worker = await example.startDelegate("chat-2", "worker", {
  onEvent: (ev) => workerEvents.send("event", ev),
  onEnd: (err) => ends.push(["worker", err]),
});

// A message to a delegate a window started reaches that window.
const task = await asker.send("discussant-2", text("what do you think?"));
const [, chatId, id, created] = await chat2.next(([ch, , , ev]) => ch === "a2a:event" && has(ev, task.id));
assert.deepEqual([chatId, id], ["chat-2", "discussant-2"]);
assert.ok(has(created, "what do you think?"));

// A round trip between two delegates startDelegate returned.
const job = await asker.send("worker", text("ship it?"));
await workerEvents.next(([, ev]) => has(ev, job.id, "ship it?"));
await worker.update(job.id, "completed", { message: text("ship it") });
await askerEvents.next(([, ev]) => has(ev, job.id, "completed"));

// A chat that closes ends its delegate's events, without an error.
await stub.invoke("a2a:close", chat1, "chat-1");
assert.deepEqual((await chat1.next(([ch]) => ch === "a2a:end")).slice(1), ["chat-1", "discussant", null]);

// Quitting waits for the host to close: the broker stops, then the app quits.
const conn = join(process.env.ELECTRON_USER_DATA, "a2a-bus", "connection.json"); // in the app's data dir
const { pid } = JSON.parse(readFileSync(conn, "utf8"));
process.kill(pid, 0); // the broker runs
assert.ok(!existsSync(join(process.env.XDG_RUNTIME_DIR, "a2a-bus", "connection.json")), "the app's broker is not at serve's default place");
app.quit();
assert.equal(stub.prevented, 1, "will-quit was not prevented");
assert.equal(stub.quit, false, "the app quit before the host closed");
assert.equal(await stub.ended, 0);
assert.ok(!existsSync(conn), "the broker's connection file is still there");
assert.throws(() => process.kill(pid, 0), { code: "ESRCH" }, "the broker still runs");
assert.deepEqual((await chat2.next(([ch]) => ch === "a2a:end")).slice(1), ["chat-2", "discussant-2", null]);
assert.deepEqual(ends.sort(), [["asker", undefined], ["worker", undefined]]);
await assert.rejects(asker.get(task.id), ClosedError);

console.log(JSON.stringify({ first, second, task: task.id, job: job.id, prevented: stub.prevented, workerEvents: workerEvents.sent.length }));
// Nothing is left to run: the process ends by itself.
