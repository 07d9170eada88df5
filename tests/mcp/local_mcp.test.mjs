// Issue #13 on the local runtime: @modelcontextprotocol/sdk (the TypeScript SDK, v1) against `kiln` without
// `--runtime` and without credentials (the local runtime's /mcp needs none), behind the contract proxy.
//
// 1. The SDK connects (Streamable HTTP) and lists the 4 tools.
// 2. `list_node_types` with a filter answers the matching node types as text JSON.
// 3. `queue_prompt` with `wait_seconds` runs a CPU workflow and answers the finished job with its PNG image.
// 4. A workflow that fails validation is a tool error (`isError`) naming the problem, not a protocol error.
//
// Usage: node tests/mcp/local_mcp.test.mjs <path to kiln>
import assert from 'node:assert/strict';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

import { assertFinishedJob, startKiln, toolNames, workflow } from './kiln.mjs';

const [kilnBinary] = process.argv.slice(2);
if (!kilnBinary) {
  console.error('usage: local_mcp.test.mjs <path to kiln>');
  process.exit(2);
}

const kiln = await startKiln(kilnBinary, { runtime: 'local' });
let passed = 0;
const ok = (what) => console.log(`ok ${++passed} - ${what}`);
try {
  const transport = new StreamableHTTPClientTransport(new URL(`${kiln.url}/mcp`));
  const client = new Client({ name: 'kiln-black-box-test', version: '1.0.0' });
  await client.connect(transport);
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), toolNames);
  ok('local /mcp without credentials: the SDK connects and lists the 4 tools');

  const listed = await client.callTool({ name: 'list_node_types', arguments: { filter: 'imageinvert' } });
  assert.ok(!listed.isError, JSON.stringify(listed.content));
  const nodeTypes = JSON.parse(listed.content.find((block) => block.type === 'text').text);
  assert.ok(JSON.stringify(nodeTypes).includes('ImageInvert'), 'the filter finds ImageInvert');
  assert.ok(!JSON.stringify(nodeTypes).includes('EmptyImage'), 'the filter leaves other node types out');
  ok('list_node_types with a case-insensitive filter');

  const queued = await client.callTool(
    { name: 'queue_prompt', arguments: { prompt: workflow, wait_seconds: 60 } },
    undefined,
    { timeout: 120_000 },
  );
  assertFinishedJob(queued);
  ok('queue_prompt with wait_seconds answers the finished job and its PNG image');

  const broken = structuredClone(workflow);
  broken[2].inputs.image = ['9', 0];
  const refused = await client.callTool({ name: 'queue_prompt', arguments: { prompt: broken } });
  assert.equal(refused.isError, true, 'a workflow that fails validation is a tool error');
  assert.ok(refused.content.some((block) => block.type === 'text' && block.text.length > 0), 'it names the error');
  ok('queue_prompt with an invalid workflow answers isError with the error');

  await transport.close();
} finally {
  await kiln.stop();
}
console.log(`${passed} passed, 0 failed`);
