// `node --import ./register.mjs main.mjs`: "electron" imports the stand-in
// beside this file (electron.mjs) instead of Electron.
import { register } from "node:module";

register("./hooks.mjs", import.meta.url);
