// @mythic-npc/client: the TypeScript client of a Mythic server (v1 protocol), for browsers and Node.
export * from "./client.js";
export * from "./errors.js";
export * from "./lipsync.js";
export * from "./protocol.js";
export * from "./scene.js";
export type * from "./generated/messages.js";
