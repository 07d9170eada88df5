// Issue #13 against the MCP project's own authorization-server conformance suite,
// @modelcontextprotocol/conformance (pinned in package.json, run from node_modules/.bin), `authorization`
// command: scenario `authorization-server-metadata-endpoint` (RFC 8414 metadata, issuer equal to --url, S256,
// `code`) then `authorization-code-grant` (exactly one `code`, the same `state`, `iss` equal to the issuer at its
// /callback; a 200 JSON token response with `Cache-Control: no-store`).
//
// For each run: a client is registered by DCR with redirect `http://127.0.0.1:<P>/callback`; the suite prints
// the authorization URL and waits on its callback server at P; the consent driver signs in, allows, and GETs
// `redirect_to` (the suite's callback). The suite must exit 0 and end with `Total: N passed, 0 failed`. Run once
// with `--resource <issuer>/mcp` (sent at authorize and token) and once without (Kiln then binds the canonical
// resource).
//
// Usage: node tests/mcp/conformance.mjs <path to kiln>
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { decide, signIn } from './consent.mjs';
import { freePort, password, startKiln } from './kiln.mjs';

const [kilnBinary] = process.argv.slice(2);
if (!kilnBinary) {
  console.error('usage: conformance.mjs <path to kiln>');
  process.exit(2);
}
const here = dirname(fileURLToPath(import.meta.url));
const conformance = join(here, '..', '..', 'node_modules', '.bin', 'conformance');
// The suite's bundle imports fs.globSync (Node.js 22); node20.mjs lets it start on the project's Node.js 20.
const node = [process.execPath, '--import', pathToFileURL(join(here, 'node20.mjs')).href];

/** Registers a public client by DCR for `redirectUri`; answers its client_id. */
async function register(issuer, redirectUri) {
  const answer = await fetch(`${issuer}/oauth/register`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      client_name: 'MCP conformance suite',
      redirect_uris: [redirectUri],
      token_endpoint_auth_method: 'none',
      grant_types: ['authorization_code'],
      response_types: ['code'],
    }),
  });
  const body = await answer.json();
  assert.equal(answer.status, 201, `registration answered ${answer.status}: ${JSON.stringify(body)}`);
  return body.client_id;
}

/**
 * Runs `conformance authorization` against `issuer` (with `--resource` when `resource` is given), playing the
 * browser when it prints the authorization URL. Resolves to its exit code and output.
 */
async function runSuite({ issuer, cookie, resource }) {
  const port = await freePort();
  const clientId = await register(issuer, `http://127.0.0.1:${port}/callback`);
  const args = ['authorization', '--url', issuer, '--client-id', clientId, '--port', String(port)];
  if (resource) args.push('--resource', resource);
  const suite = spawn(node[0], [...node.slice(1), conformance, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  const output = [];
  suite.stderr.on('data', (chunk) => output.push(chunk.toString()));
  const killer = setTimeout(() => suite.kill('SIGKILL'), 120_000);
  const exited = new Promise((resolve) => suite.on('exit', (code, signal) => resolve(code ?? signal)));
  let browsed;
  for await (const line of createInterface({ input: suite.stdout })) {
    output.push(`${line}\n`);
    if (!browsed && line.startsWith(`${issuer}/oauth/authorize?`)) {
      const url = new URL(line);
      assert.equal(url.searchParams.get('resource'), resource ?? null);
      browsed = (async () => {
        const { redirectTo } = await decide(url, { issuer, cookie });
        assert.equal(redirectTo.origin, `http://127.0.0.1:${port}`);
        const callback = await fetch(redirectTo);
        assert.equal(callback.status, 200, 'the suite took the callback');
        await callback.text();
      })();
      // The suite waits for the callback while its output is read on; a failed driver stops it.
      browsed.catch(() => suite.kill('SIGKILL'));
    }
  }
  const code = await exited;
  clearTimeout(killer);
  const text = output.join('');
  if (browsed) await browsed;
  assert.ok(browsed, `the suite printed no authorization URL:\n${text}`);
  return { code, text };
}

const kiln = await startKiln(kilnBinary, { runtime: 'cloud', users: [['alice', { role: 'owner' }]] });
const issuer = kiln.url;
let runs = 0;
try {
  const cookie = await signIn(issuer, 'alice', password);
  for (const resource of [`${issuer}/mcp`, undefined]) {
    const { code, text } = await runSuite({ issuer, cookie, resource });
    const what = resource ? 'with --resource' : 'without --resource';
    const total = text.match(/^Total: (\d+) passed, (\d+) failed$/m);
    assert.ok(total, `no summary from the suite (${what}):\n${text}`);
    assert.equal(total[2], '0', `the suite failed checks (${what}):\n${text}`);
    assert.equal(code, 0, `the suite exited ${code} (${what}):\n${text}`);
    assert.ok(Number(total[1]) >= 2, `the suite ran both scenarios (${what}):\n${text}`);
    runs += 1;
    console.log(`ok ${runs} - conformance authorization ${what}: ${total[0]}`);
  }
} finally {
  await kiln.stop();
}
console.log(`${runs} passed, 0 failed`);
