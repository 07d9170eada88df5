// Convenience names over the generated `schema.d.ts` (which is generated from spec/openapi.yaml; do not edit it).
import type { components, operations, paths } from "./schema";

export type { components, operations, paths };

/** Every component schema of the spec, by name: `Schemas["PromptRequest"]`. */
export type Schemas = components["schemas"];

/** A text frame the server sends on `/ws`, discriminated by `type`. */
export type WsMessage = Schemas["WsMessage"];

/** The `data` of the websocket frame whose `type` is `T`. */
export type WsData<T extends WsMessage["type"]> = Extract<WsMessage, { type: T }>["data"];

/** The JSON body of an operation's 200 (or 201) answer. */
export type OkJson<Op extends keyof operations> = operations[Op]["responses"] extends infer R
  ? R extends { 200: { content: { "application/json": infer B } } }
    ? B
    : R extends { 201: { content: { "application/json": infer B } } }
      ? B
      : never
  : never;
