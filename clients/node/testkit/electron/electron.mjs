// A stand-in for the few Electron main-process calls the example makes:
// app.whenReady, app.getPath("userData"), app.on/once, app.quit, app.exit, ipcMain.handle. Electron
// emits before-quit and will-quit on app.quit(), and quits unless a
// listener called preventDefault; `stub` is the test's side of it.
import { EventEmitter } from "node:events";

const emitter = new EventEmitter();
const ready = new Promise((resolve) => setImmediate(resolve));
const handlers = new Map();
let quitted;
const ended = new Promise((resolve) => (quitted = resolve));

/** What the test reads and drives. */
export const stub = {
  /** will-quit events a listener prevented. */
  prevented: 0,
  /** Whether the app quit (or exited). */
  quit: false,
  /** Resolves when the app quits (after "quit") or exits: to app.exit's code, or 0. */
  ended,
  /** A renderer's webContents: what it was sent, and a wait for the next matching send. */
  sender() {
    const sent = [];
    const waiters = [];
    return {
      sent,
      isDestroyed: () => false,
      send(...args) {
        sent.push(args);
        for (const w of [...waiters]) {
          if (w.match(args)) {
            waiters.splice(waiters.indexOf(w), 1);
            w.resolve(args);
          }
        }
      },
      /** The first send, past or future, whose arguments match. */
      next(match) {
        const found = sent.find(match);
        if (found) return Promise.resolve(found);
        return new Promise((resolve) => waiters.push({ match, resolve }));
      },
    };
  },
  /** ipcRenderer.invoke from a renderer whose webContents is sender. */
  async invoke(channel, sender, ...args) {
    const h = handlers.get(channel);
    if (!h) throw new Error(`no handler for ${channel}`);
    return h({ sender }, ...args);
  },
};

function quitEvent() {
  return {
    defaultPrevented: false,
    preventDefault() {
      this.defaultPrevented = true;
    },
  };
}

export const app = {
  whenReady: () => ready,
  /** The app's folders: "userData" is ELECTRON_USER_DATA, a folder of the test's own. */
  getPath(name) {
    if (name !== "userData" || !process.env.ELECTRON_USER_DATA) throw new Error(`the stand-in has no path for ${name}`);
    return process.env.ELECTRON_USER_DATA;
  },
  on(name, fn) {
    emitter.on(name, fn);
    return app;
  },
  once(name, fn) {
    emitter.once(name, fn);
    return app;
  },
  quit() {
    if (stub.quit) return;
    const before = quitEvent();
    emitter.emit("before-quit", before);
    if (before.defaultPrevented) return;
    const will = quitEvent();
    emitter.emit("will-quit", will);
    if (will.defaultPrevented) {
      stub.prevented++;
      return;
    }
    stub.quit = true;
    emitter.emit("quit", quitEvent(), 0);
    quitted(0);
  },
  exit(code = 0) {
    // No events, as in Electron: the app ends at once.
    if (stub.quit) return;
    stub.quit = true;
    quitted(code);
  },
};

export const ipcMain = {
  handle(channel, fn) {
    if (handlers.has(channel)) throw new Error(`a second handler for ${channel}`);
    handlers.set(channel, fn);
  },
  removeHandler(channel) {
    handlers.delete(channel);
  },
};

export default { app, ipcMain };
