import type { Methods } from "./wire.gen.js";

/** The methods a host calls (a2a.sessions.*, a2a.admin.*): those of Methods whose caller is "host". */
export type HostMethod = { [M in keyof Methods]: Methods[M]["caller"] extends "host" ? M : never }[keyof Methods];

/** A method's params. */
export type ParamsOf<M extends keyof Methods> = Methods[M]["params"];

/** A method's result. */
export type ResultOf<M extends keyof Methods> = Methods[M]["result"];

/**
 * What callHost takes after the method: its params, which may be left out
 * when they have no required member, then the call's options.
 */
export type HostCallArgs<M extends HostMethod> = {} extends ParamsOf<M>
  ? [params?: ParamsOf<M>, opts?: { signal?: AbortSignal }]
  : [params: ParamsOf<M>, opts?: { signal?: AbortSignal }];
