// A page's use of the browser entry, compiled as a page is: the DOM's
// library, no Node types. Every declaration it reaches must compile so.
import { connectSession, isCode, text, type ConnectSessionOptions, type Delegate, type PageCredentials, type Session, type Task } from "@a2a-bus/host/browser";
import * as bundle from "@a2a-bus/host/browser/bundle";

declare const bridge: { a2aCredentials(contextId: string): Promise<PageCredentials> };

const opts: ConnectSessionOptions = { contextId: "chat-1", credentials: (id) => bridge.a2aCredentials(id), callTimeoutMs: 5000 };

export async function chat(): Promise<Task | undefined> {
  const session: Session = await connectSession(opts);
  const d: Delegate = await session.spawn({ name: "discussant", description: "reads the thread" });
  for await (const ev of d.events({ signal: AbortSignal.timeout(1000) })) {
    if (ev.kind === "created") return d.update(ev.taskId, "completed", { message: text("done") });
    if (ev.kind === "resync") console.log(ev.resync.lost.length);
  }
  try {
    await d.send("peer", text("hi"));
  } catch (err) {
    if (isCode(err, "A2A_NO_PEERS")) return undefined;
  }
  await session.close();
  return undefined;
}

// The bundle is the same module.
export const same: typeof connectSession = bundle.connectSession;
