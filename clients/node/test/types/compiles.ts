// Code a user of the package writes: it must compile, against the
// declarations the build writes.
import {
  Host,
  text,
  type AdminInfo,
  type DelegateEvent,
  type Delegate,
  type Message,
  type PageCredentials,
  type Part,
  type SessionCredentials,
  type Task,
  type WaitEvent,
} from "@a2a-bus/host";

const parts: Part[] = [
  { kind: "text", text: "hello" },
  { kind: "text", text: "", metadata: { lang: "en" } },
  { kind: "data", data: { ok: true } },
  { kind: "data", data: null },
  { kind: "file", file: { bytes: "aGk=", mimeType: "text/plain" } },
  { kind: "file", file: { uri: "https://example.com/a.pdf", name: "a.pdf" } },
];

// A part narrows on its kind.
function show(p: Part): string {
  switch (p.kind) {
    case "text":
      return p.text;
    case "data":
      return JSON.stringify(p.data);
    case "file":
      return p.file.uri !== undefined ? p.file.uri : p.file.bytes;
  }
}

async function main(): Promise<void> {
  const host = await Host.open({ bus: "nats" });
  const info: AdminInfo = await host.callHost("a2a.admin.info");
  const page = await host.callHost("a2a.admin.sessions", { pageSize: 10 }, { signal: AbortSignal.timeout(1000) });
  const creds: SessionCredentials = await host.callHost("a2a.sessions.open", { contextId: "chat-1" });
  const forPage: PageCredentials = await host.sessionCredentials("chat-1", { signal: AbortSignal.timeout(1000) });
  const wsUrl: string = forPage.wsUrl; // always there: a broker without a listener is refused
  const listener: string | undefined = creds.wsUrl; // there when the broker has one
  const closed: string[] = (await host.callHost("a2a.sessions.close", { contextId: "chat-1", keepAgents: true })).deregistered;
  console.log(info.epoch, page.sessions.length, creds.url, closed, wsUrl, listener);

  const chat = await host.session("chat-1");
  const d: Delegate = await chat.spawn({ name: "worker", metadata: { role: "test" } });
  const m: Message = { messageId: "m-1", parts: [parts[0]] };
  await d.send("peer", m, { metadata: { topic: "naming" } });
  await d.push(undefined, text("fyi"));

  for await (const ev of d.events({ signal: AbortSignal.timeout(1000) })) {
    const e: DelegateEvent = ev;
    if (e.kind === "push") {
      console.log(e.from, e.message.parts.map(show));
    } else if (e.kind === "resync") {
      console.log(e.resync.reason, e.resync.lost, e.resync.changed.map((t: Task) => t.id));
    } else {
      const t: Task = e.task;
      const done: boolean = e.final;
      console.log(e.kind, e.taskId, e.state, t.status.state, done, e.message?.parts[0].text, e.event.seq);
    }
    // Every member is there on the union: undefined where it does not apply.
    const maybe: string | undefined = ev.taskId;
    console.log(maybe);
  }

  // wait keeps its shape: the event as the broker sent it.
  const w: WaitEvent = await d.wait();
  if (w.task) console.log(w.task.kind, w.task.task.status.state);
  await host.close();
}

void main;
