// `node --import ./tests/mcp/node20.mjs …` lets @modelcontextprotocol/conformance start on Node.js 20 (the
// project's Node): its bundle imports `globSync` from `fs`, which Node.js has from 22 on and which only its
// `tier-check` command calls. On a Node.js without it, `fs` imported from that package resolves to a module
// that is `node:fs` plus a `globSync` that says so. On Node.js 22 and later this does nothing.
import fs from 'node:fs';
import { register } from 'node:module';

if (typeof fs.globSync !== 'function') {
  register(
    'data:text/javascript,' +
      encodeURIComponent(`
        const shim = 'data:text/javascript,' + encodeURIComponent(
          "export * from 'node:fs'; export { default } from 'node:fs';" +
          "export function globSync() { throw new Error('fs.globSync needs Node.js 22'); }");
        export async function resolve(specifier, context, next) {
          if ((specifier === 'fs' || specifier === 'node:fs') &&
              context.parentURL?.includes('/@modelcontextprotocol/conformance/')) {
            return { url: shim, shortCircuit: true };
          }
          return next(specifier, context);
        }`),
  );
}
