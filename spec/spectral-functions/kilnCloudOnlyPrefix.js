// Spectral function: an operation's description starts with "[cloud-only] " if and only if its
// x-runtime is exactly [cloud]. Operations without x-runtime are left to kiln-x-runtime-present.
const PREFIX = "[cloud-only] ";

export default (operation) => {
  if (operation === null || typeof operation !== "object") return;
  const runtime = operation["x-runtime"];
  if (!Array.isArray(runtime)) return;
  const cloudOnly = runtime.length === 1 && runtime[0] === "cloud";
  const description = typeof operation.description === "string" ? operation.description : "";
  const prefixed = description.startsWith("[cloud-only]");
  if (cloudOnly && !description.startsWith(PREFIX)) {
    return [{ message: `x-runtime is [cloud], so the description must start with "${PREFIX}"`, path: ["description"] }];
  }
  if (!cloudOnly && prefixed) {
    return [{ message: `x-runtime is [${runtime.join(", ")}], so the description must not start with "[cloud-only]"`, path: ["description"] }];
  }
};
