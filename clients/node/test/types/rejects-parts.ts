// Parts the broker refuses do not compile. Each marked line must fail
// with the error it names (test/types.test.mjs checks which).
import type { Artifact, Message, Part } from "@a2a-bus/host";

// @ts-expect-error TS2322 a text part without its text
export const noText: Part = { kind: "text" };
// @ts-expect-error TS2322 a file part holds a file, not data
export const fileWithData: Part = { kind: "file", data: 5 };
// @ts-expect-error TS2322 a text part has no data besides
export const twoMembers: Part = { kind: "text", text: "x", data: 1 };
// @ts-expect-error TS2322 no such kind
export const image: Part = { kind: "image", text: "x" };
// @ts-expect-error TS2322 text is a string
export const numberText: Part = { kind: "text", text: 5 };
// @ts-expect-error TS2322 a file has exactly one of bytes and uri
export const both: Part = { kind: "file", file: { bytes: "aGk=", uri: "https://example.com" } };
// @ts-expect-error TS2322 a file with neither
export const neither: Part = { kind: "file", file: { name: "a.pdf" } };
// @ts-expect-error TS2322 metadata is an object
export const badMetadata: Part = { kind: "text", text: "x", metadata: "en" };
// @ts-expect-error TS2322 a message has a part at least
export const empty: Message = { messageId: "m", parts: [] };
// @ts-expect-error TS2741 an artifact needs its id
export const noId: Artifact = { parts: [{ kind: "text", text: "x" }] };
