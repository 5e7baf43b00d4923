// A call has one deadline, callTimeoutMs, for all its attempts and its
// waits for a broker: a call whose broker is gone fails as unavailable
// within it, not after a timeout per retry.
import { test } from "node:test";
import assert from "node:assert/strict";
import { once } from "node:events";
import { join } from "node:path";

import { Host, UnavailableError } from "../dist/index.js";
import { checkLeaks, tempDir, text } from "../testkit/helpers.mjs";
import { serve } from "../testkit/broker.mjs";

checkLeaks();

// The host joined a broker that is then killed, and that no one starts
// again. Its retries would go on for ever (a billion attempts): the send,
// made with no signal, ends at the call's deadline with UnavailableError.
test("TestACallToAKilledJoinedBrokerEndsAtItsDeadline [nats]", { timeout: 60_000 }, async (t) => {
  const dir = tempDir(t);
  const { p: broker, path } = await serve(t, [`--connection-file=${join(dir, "run", "connection.json")}`, "--data-dir="]);
  const host = await Host.open({ bus: "nats", connectionFile: path, callTimeoutMs: 1500, retry: { attempts: 1e9, backoffMs: 10, maxBackoffMs: 10 } });
  t.after(() => host.close());
  const s = await host.session("s1");
  const asker = await s.spawn({ name: "asker" });
  await s.spawn({ name: "worker" });

  broker.kill("SIGKILL");
  await once(broker, "close");
  // The send, and reads, the host's own calls and a new session likewise,
  // all at once: each is bounded by its own deadline.
  await Promise.all([
    assert.rejects(asker.send("worker", text("is anyone there?")), (err) => {
      assert.ok(err instanceof UnavailableError, `the send fails as unavailable: ${err?.name}: ${err?.message}`);
      assert.match(err.message, /^a2a\.message\.send: no answer within 1500 ms/);
      return true;
    }),
    assert.rejects(asker.get("no-such-task"), /^UnavailableError: a2a\.tasks\.get: no answer within 1500 ms/),
    assert.rejects(host.callHost("a2a.admin.info"), UnavailableError),
    assert.rejects(host.session("s2"), UnavailableError),
  ]);
  // A caller's signal ends a call sooner, with its own reason.
  const why = new Error("the user gave up");
  const ac = new AbortController();
  const gaveUp = asker.send("worker", text("still there?"), { signal: ac.signal });
  ac.abort(why);
  await assert.rejects(gaveUp, (e) => e === why);
});
