// Type-checked with `tsc --noEmit -p client/typescript` in the test command: if the spec changes a shape used
// here, this file stops compiling. It is an example for frontend developers, not shipped code.
import type { OkJson, Schemas, WsData, WsMessage } from "../src/index";

// Submitting a prompt: the body and the answer.
export const request: Schemas["PromptRequest"] = {
  prompt: {
    "1": { class_type: "EmptyImage", inputs: { width: 64, height: 64, batch_size: 1, color: 0 } },
    "2": { class_type: "ImageInvert", inputs: { image: ["1", 0] } },
    "3": { class_type: "SaveImage", inputs: { images: ["2", 0], filename_prefix: "kiln" } },
  },
  client_id: "0123456789abcdef0123456789abcdef",
};

export function firstNodeError(answer: OkJson<"executePrompt">): string | undefined {
  const [nodeId] = Object.keys(answer.node_errors);
  return nodeId;
}

// The queue is a list of 5-tuples.
export function pendingCount(queue: OkJson<"getQueue">): number {
  return queue.queue_pending.length + queue.queue_running.length;
}

// Websocket frames narrow on `type` (the discriminator mapping makes `type` the wire name, not the schema name).
export function describe(message: WsMessage): string {
  switch (message.type) {
    case "executing":
      return message.data.node === null ? "done" : `running ${message.data.node}`;
    case "progress":
      return `${message.data.value}/${message.data.max}`;
    case "execution_error":
      return `${message.data.node_type} failed: ${message.data.exception_message}`;
    default:
      return message.type;
  }
}

export const cached: WsData<"execution_cached"> = { nodes: ["1"], prompt_id: "p", timestamp: 0 };

// The OAuth token answer of the cloud runtime.
export function bearer(token: OkJson<"oauthToken">): string {
  return `${token.token_type} ${token.access_token}`;
}

// A wrong shape must not compile: the answer of POST /api/prompt needs `number` and `node_errors`.
// @ts-expect-error missing required properties
export const incomplete: OkJson<"executePrompt"> = { prompt_id: "p" };
