// An Electron main process that hosts a2a-bus: a session per chat, a
// delegate per agent a chat starts, each delegate's events sent to the
// window that started it, and a quit that waits for the host to close.
// ELECTRON.md explains it; test/electron.test.mjs runs this file under
// Node with a stand-in for the few Electron calls it makes.
import { join } from "node:path";
import { app, ipcMain } from "electron";
import { ClosedError, Host, SettledError } from "@a2a-bus/host";

// The app's own data dir, in its userData folder, holds its broker's tasks
// and connection file: Host.open joins the broker already running there
// (a second instance of this app), else starts, with no `binary`, the
// broker of this platform's package (@a2a-bus/host-darwin-arm64,
// @a2a-bus/host-win32-x64, ...: the one npm installed beside
// @a2a-bus/host), from node_modules when the app runs unpackaged and from
// app.asar.unpacked when it is packaged. A broker it starts is a sidecar
// that exits with this process. Another app has a broker of its own.
const dataDir = () => join(app.getPath("userData"), "a2a-bus");
const opening = app.whenReady().then(() => Host.open({ bus: "nats", dataDir: dataDir() }));
opening.catch((err) => console.error("a2a-bus: the host did not open:", err));

const sessions = new Map(); // chat id → its session (a promise of it)
const loops = new Set(); // the delegates' event loops still running

function sessionOf(chatId) {
  let s = sessions.get(chatId);
  if (!s) {
    s = opening.then((host) => host.session(chatId));
    s.catch(() => sessions.delete(chatId)); // the next start tries again
    sessions.set(chatId, s);
  }
  return s;
}

/**
 * Registers a delegate named `name` in chat `chatId` and returns it. Its
 * events (a task event, a push, or a resync) go to onEvent(ev, delegate)
 * until it settles or its session or the host closes; then
 * onEnd(error, delegate) is called, error undefined unless something else
 * ended them.
 */
export async function startDelegate(chatId, name, { onEvent, onEnd = () => {} }) {
  const delegate = await (await sessionOf(chatId)).spawn({ name });
  const loop = (async () => {
    try {
      for (;;) onEvent(await delegate.wait(), delegate);
    } catch (err) {
      onEnd(err instanceof ClosedError || err instanceof SettledError ? undefined : err, delegate);
    }
  })();
  loops.add(loop);
  loop.then(() => loops.delete(loop));
  return delegate;
}

/**
 * Closes a chat's session: its delegates settle (their open tasks end and
 * their peers are told) and their loops end.
 */
export async function closeChat(chatId) {
  const s = sessions.get(chatId);
  sessions.delete(chatId);
  if (s) await (await s).close();
}

// The renderer, through its preload script:
//   ipcRenderer.invoke("a2a:start", chatId, name) → {id, prompt}
//   ipcRenderer.on("a2a:event", (_, chatId, id, ev) => ...)
//   ipcRenderer.on("a2a:end", (_, chatId, id, error) => ...)
//   ipcRenderer.invoke("a2a:close", chatId)
ipcMain.handle("a2a:start", async ({ sender }, chatId, name) => {
  const send = (...args) => {
    if (!sender.isDestroyed()) sender.send(...args);
  };
  const d = await startDelegate(chatId, name, {
    onEvent: (ev, d) => send("a2a:event", chatId, d.id, ev),
    onEnd: (err, d) => send("a2a:end", chatId, d.id, err === undefined ? null : String(err)),
  });
  return { id: d.id, prompt: d.prompt }; // plain data: the handle stays here
});
ipcMain.handle("a2a:close", (_event, chatId) => closeChat(chatId));

// Quitting waits for the host to close: its sessions leave (their
// delegates stay registered, as when an app dies), the broker it started
// stops, and the loops end. Then app.quit() again, which this lets pass.
let quitting;
let closed = false;
app.on("will-quit", (event) => {
  if (closed) return;
  event.preventDefault();
  quitting ??= opening
    .then((host) => host.close(), () => {}) // a host that did not open has nothing to close
    .then(() => Promise.all(loops))
    .catch((err) => console.error("a2a-bus: closing the host failed:", err))
    .finally(() => {
      closed = true;
      app.quit();
    });
});
