// What the MCP black-box tests share: the real kiln binary started on a free port with a fresh data directory,
// behind kiln-contract-proxy (every answer checked against spec/openapi.yaml); cloud users made with the CLI; a
// workflow that runs on CPU without model files; and checks on the MCP answers.
//
// The cloud runtime names its issuer at start (`--issuer`) and MCP clients reject metadata whose issuer or
// resource is on another origin than the URL they were given, so the proxy starts first, on its own port, and
// kiln starts with the proxy's URL as its issuer and the port the proxy forwards to. KILN_MCP_DIRECT=1 skips the
// proxy (kiln's own address is then the issuer).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { contractProxy, spawnListening } from '../browser/common.mjs';

/** The password every test user gets. */
export const password = 'a long enough password';

/** EmptyImage -> ImageInvert -> SaveImage: runs on CPU in well under a second, needs no model files. */
export const workflow = {
  1: { class_type: 'EmptyImage', inputs: { width: 48, height: 32, batch_size: 1, color: 0x336699 } },
  2: { class_type: 'ImageInvert', inputs: { image: ['1', 0] } },
  3: { class_type: 'SaveImage', inputs: { images: ['2', 0], filename_prefix: 'mcp' } },
};

/** The MCP tools Kiln serves, sorted. */
export const toolNames = ['get_job', 'list_models', 'list_node_types', 'queue_prompt'];

/** A loopback TCP port nobody listens on right now. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/**
 * Starts `kiln` (runtime "local" or "cloud") on a fresh data directory, behind the contract proxy; for the
 * cloud runtime first creates `users` ([name, {workspace, role}] pairs, all with `password`). Resolves to
 * `{ url, stop }`: `url` is what clients talk to (for cloud, also the issuer); `stop()` ends both and throws if
 * kiln sent an answer the spec does not describe.
 */
export async function startKiln(kilnBinary, { runtime, users = [] }) {
  const dataDir = mkdtempSync(join(tmpdir(), `kiln-mcp-${runtime}-`));
  for (const [name, { workspace = 'default', role = 'owner' } = {}] of users) {
    execFileSync(
      kilnBinary,
      ['user', 'add', name, '--workspace', workspace, '--role', role, '--data-dir', dataDir],
      { input: `${password}\n`, stdio: ['pipe', 'ignore', 'pipe'] },
    );
  }
  const direct = process.env.KILN_MCP_DIRECT === '1';
  const port = await freePort();
  const proxy = direct ? undefined : await spawnListening(contractProxy, [`127.0.0.1:${port}`, runtime]);
  const url = proxy?.url ?? `http://127.0.0.1:${port}`;
  const args = ['--port', String(port), '--data-dir', dataDir, '--disable-front-end'];
  if (runtime === 'cloud') args.push('--runtime', 'cloud', '--issuer', url);
  let kiln;
  try {
    kiln = await spawnListening(kilnBinary, args);
  } catch (error) {
    proxy?.child.kill('SIGKILL');
    throw error;
  }
  const stop = async () => {
    let report = '';
    let code = 0;
    if (proxy) {
      const lines = [];
      proxy.lines.on('line', (line) => lines.push(line));
      const exited = new Promise((resolve) => proxy.child.on('exit', resolve));
      proxy.child.kill('SIGTERM');
      // An event stream still open through the proxy holds its graceful shutdown until kiln goes away.
      const timer = setTimeout(() => kiln.child.kill('SIGKILL'), 5_000);
      code = await exited;
      clearTimeout(timer);
      report = lines.join('\n');
      console.log(report.split('\n')[0]);
    }
    kiln.child.kill('SIGKILL');
    rmSync(dataDir, { recursive: true, force: true });
    assert.equal(code, 0, `kiln sent answers the spec does not describe:\n${report}`);
  };
  return { url, stop, dataDir };
}

/** Asserts that `base64` is a PNG file; answers its bytes. */
export function assertPng(base64) {
  const bytes = Buffer.from(base64, 'base64');
  assert.deepEqual([...bytes.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 'a PNG signature');
  return bytes;
}

/**
 * Checks a `queue_prompt` (with `wait_seconds`) or `get_job` tool result for a finished run of `workflow`:
 * success, the job as text JSON, and (unless `images` is false) one PNG image block. Answers the job.
 */
export function assertFinishedJob(result, { images = true } = {}) {
  assert.ok(!result.isError, `the tool failed: ${JSON.stringify(result.content)}`);
  const text = result.content.find((block) => block.type === 'text');
  assert.ok(text, 'the result has a text block');
  const job = JSON.parse(text.text);
  assert.equal(job.status, 'success', `the job succeeded: ${text.text}`);
  assert.equal(typeof job.prompt_id, 'string');
  const pictures = result.content.filter((block) => block.type === 'image');
  if (images) {
    assert.equal(pictures.length, 1, 'one image for the one SaveImage output');
    assert.equal(pictures[0].mimeType, 'image/png');
    assertPng(pictures[0].data);
  } else {
    assert.equal(pictures.length, 0, 'no image blocks when include_images is false');
  }
  return job;
}

/** An MCP `initialize` request, as a client's first POST to /mcp sends it. */
export const initialize = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: {
    protocolVersion: '2025-11-25',
    capabilities: {},
    clientInfo: { name: 'kiln-black-box-test', version: '1.0.0' },
  },
};

/** POSTs `initialize` to `<url>/mcp` with `headers`; answers the response (body not read). */
export function postInitialize(url, headers = {}) {
  return fetch(`${url}/mcp`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      ...headers,
    },
    body: JSON.stringify(initialize),
  });
}
