// What a caller gets wrong is told in its own terms: a session id that is
// no session id names the argument, not a method the host calls inside;
// a send too large for NATS names the broker's message limit, not the
// server's payload limit.
import { test } from "node:test";
import assert from "node:assert/strict";

import { A2ABusError, isCode } from "../dist/index.js";
import { BUSES, checkLeaks, openHost, text } from "../testkit/helpers.mjs";

checkLeaks();

for (const bus of BUSES) {
  test(`TestABadSessionIdIsAnInvalidParamsError [${bus}]`, async (t) => {
    const host = await openHost(t, bus);
    for (const [id, why] of [
      ["", /^host\.session: id: required/],
      ["x".repeat(257), /^host\.session: id: longer than 256 bytes/],
      ["a\nb", /^host\.session: id: contains a control character/],
      ["a\ud800b", /^host\.session: id: not valid UTF-8/],
    ]) {
      const err = await host.session(id).then(
        () => undefined,
        (e) => e,
      );
      assert.ok(err instanceof A2ABusError, `${JSON.stringify(id)}: ${err?.name}: ${err?.message}`);
      assert.ok(isCode(err, "INVALID_PARAMS"));
      assert.match(err.message, why);
      assert.doesNotMatch(err.message, /a2a\./, "no method the caller did not call");
    }
    // The longest id there is, and one of every script, are fine.
    await host.session("é".repeat(128));
  });
}

for (const [limit, args] of [
  [1 << 20, []],
  [2 << 20, ["--max-message-bytes=2097152"]],
]) {
  test(`TestATooLargeSendNamesTheBrokersMessageLimit of ${limit} [nats]`, async (t) => {
    const host = await openHost(t, "nats", { args });
    const s = await host.session("s1");
    const asker = await s.spawn({ name: "asker" });
    await s.spawn({ name: "worker" });
    for (const size of [limit + 1024, 20 << 20]) {
      const err = await asker.send("worker", text("x".repeat(size))).then(
        () => undefined,
        (e) => e,
      );
      assert.ok(err instanceof A2ABusError, `${size} bytes: ${err?.name}: ${err?.message?.slice(0, 200)}`);
      assert.ok(isCode(err, "INVALID_REQUEST"), err.message);
      // Under the server's payload limit the broker answers itself; over it,
      // the host does, in the same terms.
      assert.match(err.message, new RegExp(`over the (message )?limit of ${limit}( bytes)?$`), `${size} bytes: ${err.message}`);
    }
  });
}
