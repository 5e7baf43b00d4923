// Misuses of the API do not compile. Each marked line must fail with the
// error it names (test/types.test.mjs checks which).
import { Delegate, Host, type DelegateEvent, type Session } from "@a2a-bus/host";
// @ts-expect-error TS2305 the wire's Error is not exported
import type { Error as WireError } from "@a2a-bus/host";
// @ts-expect-error TS2305 nor its File
import type { File } from "@a2a-bus/host";
// @ts-expect-error TS2724 nor the compiler's helper types
import type { Part1 } from "@a2a-bus/host";
// @ts-expect-error TS2305 nor a session method's params
import type { SendParams } from "@a2a-bus/host";

export async function calls(host: Host, session: Session, d: Delegate): Promise<void> {
  // @ts-expect-error TS2345 no such method
  await host.callHost("a2a.admin.nothing");
  // @ts-expect-error TS2345 a session's method is not the host's
  await host.callHost("a2a.tasks.get", { token: "t", taskId: "x" });
  // @ts-expect-error TS2554 a2a.sessions.open needs its params
  await host.callHost("a2a.sessions.open");
  // @ts-expect-error TS2322 a contextId is a string
  await host.callHost("a2a.sessions.open", { contextId: 5 });
  // @ts-expect-error TS2322 the result is typed, not any
  const n: number = await host.callHost("a2a.admin.info");
  // @ts-expect-error TS2339 internal: not in the declarations
  console.log(host.bus);
  // @ts-expect-error TS2339 internal: not in the declarations
  console.log(session.naming);
  // @ts-expect-error TS2339 internal: not in the declarations
  d.deliver({ resync: { reason: "x", changed: [], lost: [] } });
  // @ts-expect-error TS2673 a delegate is spawned, not constructed
  console.log(new Delegate());
  console.log(n);
}

export function events(ev: DelegateEvent): void {
  // @ts-expect-error TS18048 a push or a resync has no taskId
  console.log(ev.taskId.length);
  // @ts-expect-error TS18048 only a task event has a task
  if (ev.kind === "push") console.log(ev.task.id);
  // @ts-expect-error TS2367 no such kind
  if (ev.kind === "task") console.log(ev);
}
