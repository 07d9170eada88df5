// Spectral function: operation shapes progenitor 0.15 cannot generate.
//
// Options: { check, allow? }
//   success             all 2xx responses have one shape
//   error               all 4xx/5xx responses have one shape
//   default             no `default` response
//   request-media-types a request body has exactly one media type
//   cookie-parameters   no `in: cookie` parameter
//   multipart           no multipart/form-data body unless the operationId is in `allow`
//
// A response's shape is what progenitor turns it into: "none" without a body, the schema of a lone JSON
// media type, or "raw" for anything else. It runs on the unresolved document so `$ref`s name the schema.

const isJson = (mediaType) => mediaType === "application/json" || /\+json$/.test(mediaType);

function responseShape(response) {
  if (response && typeof response.$ref === "string") return `response:${response.$ref}`;
  const content = (response && response.content) || {};
  const mediaTypes = Object.keys(content);
  if (mediaTypes.length === 0) return "none";
  if (mediaTypes.length === 1 && isJson(mediaTypes[0])) {
    const schema = content[mediaTypes[0]].schema || {};
    return typeof schema.$ref === "string" ? schema.$ref : `inline:${JSON.stringify(schema)}`;
  }
  return "raw";
}

function shapesOf(responses, statusPattern) {
  const shapes = new Map();
  for (const [status, response] of Object.entries(responses || {})) {
    if (!statusPattern.test(status)) continue;
    const shape = responseShape(response);
    shapes.set(shape, [...(shapes.get(shape) || []), status]);
  }
  return shapes;
}

function describe(shapes) {
  return [...shapes.entries()].map(([shape, statuses]) => `${statuses.join("/")} -> ${shape}`).join("; ");
}

export default (operation, options) => {
  if (operation === null || typeof operation !== "object") return;
  const { check, allow = [] } = options || {};
  const results = [];
  switch (check) {
    case "success":
    case "error": {
      // A raw operation (`x-kiln-raw`, e.g. MCP's Streamable HTTP) is served by a library and left out of the
      // generated client, so progenitor never sees its answers.
      if (operation["x-kiln-raw"] === true) break;
      const pattern = check === "success" ? /^2/ : /^[45]/;
      const shapes = shapesOf(operation.responses, pattern);
      if (shapes.size > 1) {
        results.push({
          message: `${check} responses must share one shape for progenitor, found ${shapes.size}: ${describe(shapes)}`,
          path: ["responses"],
        });
      }
      break;
    }
    case "default":
      if (operation.responses && Object.prototype.hasOwnProperty.call(operation.responses, "default")) {
        results.push({ message: "a `default` response breaks progenitor; declare explicit status codes", path: ["responses", "default"] });
      }
      break;
    case "request-media-types": {
      const content = (operation.requestBody && operation.requestBody.content) || {};
      const count = Object.keys(content).length;
      if (operation.requestBody && !operation.requestBody.$ref && count !== 1) {
        results.push({ message: `a request body must have exactly one media type for progenitor, found ${count}`, path: ["requestBody", "content"] });
      }
      break;
    }
    case "cookie-parameters":
      (operation.parameters || []).forEach((parameter, index) => {
        if (parameter && parameter.in === "cookie") {
          results.push({ message: `cookie parameter \`${parameter.name}\` is not supported by progenitor; use a security scheme`, path: ["parameters", index] });
        }
      });
      break;
    case "multipart": {
      const content = (operation.requestBody && operation.requestBody.content) || {};
      if ("multipart/form-data" in content && !allow.includes(operation.operationId)) {
        results.push({
          message: `multipart/form-data is not supported by progenitor; \`${operation.operationId}\` is not in the allow-list`,
          path: ["requestBody", "content", "multipart/form-data"],
        });
      }
      break;
    }
    default:
      results.push({ message: `kilnProgenitorShapes: unknown check \`${check}\`` });
  }
  return results;
};
