// A broker that misbehaves on the pipe, for the host's tests: it answers
// the host's first request (its readiness probe) as a broker would, then,
// by its first argument,
//   garbage: writes lines that are no JSON, without end, and answers nothing;
//   endless: writes one line that never ends (FAKE_LINE_MB, default 600 MB,
//            then nothing), and answers nothing.
// It stays alive until it is killed. The rest of the arguments (serve's)
// are ignored.
import { createInterface } from "node:readline";

const mode = process.argv[2];
const out = process.stdout;

/** Writes chunk() again and again, as fast as the reader takes it, n times. */
async function flood(chunk, n) {
  for (let i = 0; i < n; i++) {
    if (!out.write(chunk())) await new Promise((r) => out.once("drain", r));
  }
}

const lines = createInterface({ input: process.stdin });
lines.once("line", async (line) => {
  const req = JSON.parse(line);
  out.write(JSON.stringify({ jsonrpc: "2.0", id: req.id, result: { epoch: "fake", lastSeq: 0, events: [] } }) + "\n");
  if (mode === "garbage") {
    let i = 0;
    await flood(() => `garbage ${i++} ${"#".repeat(1000)}\n`, Infinity);
  } else if (mode === "endless") {
    const mb = Buffer.alloc(1 << 20, "x");
    out.write('{"jsonrpc":"2.0","id":1,"result":"');
    await flood(() => mb, Number(process.env.FAKE_LINE_MB || 600));
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
});
lines.on("line", () => {}); // read, and never answered
lines.on("close", () => process.exit(0)); // stdin ended: the host closes
setInterval(() => {}, 1 << 30); // alive until killed
