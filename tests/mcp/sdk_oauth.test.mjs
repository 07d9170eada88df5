// Issue #13 with a real MCP client nobody here wrote: @modelcontextprotocol/sdk (the TypeScript SDK, v1) against
// `kiln --runtime cloud --issuer <its URL>`, behind the contract proxy.
//
// 1. /mcp without a token answers 401 with a `WWW-Authenticate` challenge naming the protected-resource
//    metadata and the scopes; a signed-out browser at the authorization URL is sent to /login first.
// 2. The SDK (StreamableHTTPClientTransport, an in-memory OAuthClientProvider with a loopback redirect URI, a
//    public client, `state()`) discovers, registers by DCR and sends the browser to authorize: S256 PKCE,
//    `resource` = <issuer>/mcp, the 401's scopes. The consent driver allows; the redirect carries `code`, the
//    same `state` and `iss` = issuer. `finishAuth(code)` gets tokens; a new connection lists the 4 tools and
//    `queue_prompt` with `wait_seconds` answers the finished job with its PNG image; `get_job` answers it again.
// 3. Refresh: a rejected access token makes the SDK refresh by itself (its own path) and go on. The replaced
//    refresh token replayed while its successor is unused answers a working successor (Kiln's 30 s grace);
//    once the successor was used, the old token is reuse: `invalid_grant` (the SDK's InvalidGrantError), the
//    family is revoked, so the family's newest access token gets 401 at /mcp and its refresh token
//    `invalid_grant`.
// 4. A provider without `state()` (the SDK then sends no `state`) is accepted: the redirect has no `state`.
//
// Usage: node tests/mcp/sdk_oauth.test.mjs <path to kiln>
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import {
  UnauthorizedError,
  discoverAuthorizationServerMetadata,
  refreshAuthorization,
} from '@modelcontextprotocol/sdk/client/auth.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { InvalidGrantError } from '@modelcontextprotocol/sdk/server/auth/errors.js';

import { decide, signIn } from './consent.mjs';
import { assertFinishedJob, password, postInitialize, startKiln, toolNames, workflow } from './kiln.mjs';

const [kilnBinary] = process.argv.slice(2);
if (!kilnBinary) {
  console.error('usage: sdk_oauth.test.mjs <path to kiln>');
  process.exit(2);
}

const scopes = 'kiln:read kiln:run';

/**
 * An OAuthClientProvider that keeps everything in memory, as a CLI or desktop client does. `onRedirect(url)` plays
 * the browser and resolves to the `code` the redirect carried. Without `withState` it has no `state()` method,
 * so the SDK sends no `state`.
 */
class MemoryProvider {
  constructor({ redirectUrl, onRedirect }) {
    this._redirectUrl = redirectUrl;
    this._onRedirect = onRedirect;
    this.code = undefined;
  }
  get redirectUrl() {
    return this._redirectUrl;
  }
  get clientMetadata() {
    return {
      client_name: 'Kiln black-box test (MCP TypeScript SDK)',
      redirect_uris: [this._redirectUrl],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    };
  }
  clientInformation() {
    return this._client;
  }
  saveClientInformation(client) {
    this._client = client;
  }
  tokens() {
    return this._tokens;
  }
  saveTokens(tokens) {
    this._tokens = tokens;
  }
  async redirectToAuthorization(url) {
    this.code = await this._onRedirect(url);
  }
  saveCodeVerifier(verifier) {
    this._verifier = verifier;
  }
  codeVerifier() {
    return this._verifier;
  }
}

/** A MemoryProvider that implements `state()` and remembers the last state it handed out. */
class MemoryProviderWithState extends MemoryProvider {
  state() {
    this.lastState = randomBytes(16).toString('base64url');
    return this.lastState;
  }
}

/** A connected SDK client for `<url>/mcp` with `provider`; rejects with UnauthorizedError when it must authorize. */
async function connect(url, provider) {
  const transport = new StreamableHTTPClientTransport(new URL(`${url}/mcp`), { authProvider: provider });
  const client = new Client({ name: 'kiln-black-box-test', version: '1.0.0' });
  await client.connect(transport);
  return { client, transport };
}

/** Connects with `provider` through the whole authorization: 401, redirect, consent, `finishAuth`, reconnect. */
async function authorizeAndConnect(url, provider) {
  const transport = new StreamableHTTPClientTransport(new URL(`${url}/mcp`), { authProvider: provider });
  const first = new Client({ name: 'kiln-black-box-test', version: '1.0.0' });
  await assert.rejects(first.connect(transport), UnauthorizedError, 'the first connect needs authorization');
  assert.ok(provider.code, 'the provider was sent to authorize and got a code');
  await transport.finishAuth(provider.code);
  const tokens = provider.tokens();
  assert.equal(tokens.token_type.toLowerCase(), 'bearer');
  assert.equal(typeof tokens.access_token, 'string');
  assert.equal(typeof tokens.refresh_token, 'string', 'a client registered for refresh_token gets one');
  assert.deepEqual(tokens.scope.split(' ').sort(), scopes.split(' '));
  await transport.close();
  return connect(url, provider);
}

/** The browser's part for a provider: checks the authorization URL, allows on consent, checks the redirect. */
function browser({ issuer, cookie, redirectUrl, provider }) {
  return async (url) => {
    assert.equal(`${url.origin}${url.pathname}`, `${issuer}/oauth/authorize`);
    const query = url.searchParams;
    assert.equal(query.get('response_type'), 'code');
    assert.equal(query.get('code_challenge_method'), 'S256');
    assert.match(query.get('code_challenge'), /^[A-Za-z0-9_-]{43}$/);
    assert.equal(query.get('resource'), `${issuer}/mcp`);
    assert.equal(query.get('scope'), scopes, 'the SDK asks for the scopes of the 401 challenge');
    assert.equal(query.get('redirect_uri'), redirectUrl);
    assert.equal(query.get('state'), provider.lastState ?? null);

    const { redirectTo } = await decide(url, { issuer, cookie });
    assert.equal(`${redirectTo.origin}${redirectTo.pathname}`, redirectUrl, 'back at the client');
    const answer = redirectTo.searchParams;
    assert.equal(answer.getAll('iss').length, 1);
    assert.equal(answer.get('iss'), issuer, 'iss names the issuer (RFC 9207)');
    assert.equal(answer.get('state'), provider.lastState ?? null, 'state comes back only when it was sent');
    assert.equal(answer.get('error'), null);
    assert.ok(answer.get('code'), 'the redirect carries a code');
    return answer.get('code');
  };
}

/** Asserts that `accessToken` opens an MCP session (200) or is refused (401 `invalid_token`). */
async function assertAccessToken(url, accessToken, works) {
  const answer = await postInitialize(url, { authorization: `Bearer ${accessToken}` });
  await answer.text();
  if (works) {
    assert.equal(answer.status, 200, 'the access token opens an MCP session');
  } else {
    assert.equal(answer.status, 401, 'the access token is refused');
    assert.match(answer.headers.get('www-authenticate') ?? '', /^Bearer .*error="invalid_token"/);
  }
}

const kiln = await startKiln(kilnBinary, { runtime: 'cloud', users: [['alice', { role: 'owner' }]] });
const issuer = kiln.url;
const counts = { passed: 0 };
const passed = (what) => {
  counts.passed += 1;
  console.log(`ok ${counts.passed} - ${what}`);
};
try {
  // 1. The challenge, and a browser that is not signed in.
  const anonymous = await postInitialize(issuer);
  await anonymous.text();
  assert.equal(anonymous.status, 401);
  const challenge = anonymous.headers.get('www-authenticate') ?? '';
  assert.match(challenge, /^Bearer /);
  assert.ok(
    challenge.includes(`resource_metadata="${issuer}/.well-known/oauth-protected-resource/mcp"`),
    `the challenge names the resource metadata: ${challenge}`,
  );
  assert.ok(challenge.includes(`scope="${scopes}"`), `the challenge names the scopes: ${challenge}`);
  assert.ok(!challenge.includes('error='), 'no error in the challenge to a request without a token');
  passed('/mcp without a token: 401 with resource_metadata and scope');

  const cookie = await signIn(issuer, 'alice', password);
  const redirectUrl = 'http://127.0.0.1:53682/callback';

  // 2. The whole flow with state.
  const provider = new MemoryProviderWithState({ redirectUrl });
  let signedOutChecked = false;
  const allow = browser({ issuer, cookie, redirectUrl, provider });
  provider._onRedirect = async (url) => {
    if (!signedOutChecked) {
      const signedOut = await fetch(url, { redirect: 'manual' });
      assert.equal(signedOut.status, 303, 'a browser without a session is redirected');
      const login = new URL(signedOut.headers.get('location'), issuer);
      assert.equal(`${login.origin}${login.pathname}`, `${issuer}/login`);
      // After signing in, the login page sends the browser to `next`: the consent page, or this same request
      // again, which then goes on to the consent page.
      const next = new URL(login.searchParams.get('next'), issuer);
      assert.equal(next.origin, issuer, 'login sends the browser back to this server only');
      if (next.pathname === '/oauth/authorize') {
        assert.equal(next.href, url.href, 'login then comes back to the same authorization request');
      } else {
        assert.equal(`${next.origin}${next.pathname}`, `${issuer}/oauth/consent`, 'login then goes to consent');
        assert.ok(next.searchParams.get('oauth_request_id'));
      }
      signedOutChecked = true;
    }
    return allow(url);
  };
  const { client, transport } = await authorizeAndConnect(issuer, provider);
  assert.ok(signedOutChecked);
  passed('SDK: DCR, authorize (S256, resource, state), consent, redirect with state and iss, finishAuth');

  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), toolNames);
  passed('SDK: listTools has the 4 tools');

  const queued = await client.callTool(
    { name: 'queue_prompt', arguments: { prompt: workflow, wait_seconds: 60 } },
    undefined,
    { timeout: 120_000 },
  );
  const job = assertFinishedJob(queued);
  const again = await client.callTool({
    name: 'get_job',
    arguments: { prompt_id: job.prompt_id, include_images: false },
  });
  assertFinishedJob(again, { images: false });
  passed('SDK: queue_prompt with wait_seconds answers the finished job and its PNG; get_job answers it again');
  await transport.close();

  // 3. Refresh, first the SDK's own: a rejected access token makes it refresh and retry.
  const first = provider.tokens();
  provider.saveTokens({ ...first, access_token: 'not-a-token' });
  const refreshed = await connect(issuer, provider);
  const second = provider.tokens();
  assert.notEqual(second.access_token, first.access_token);
  assert.notEqual(second.refresh_token, first.refresh_token, 'the refresh token rotates');
  assert.deepEqual((await refreshed.client.listTools()).tools.map((t) => t.name).sort(), toolNames);
  await refreshed.transport.close();
  passed('SDK: a refused access token makes the SDK refresh by itself, and the new tokens work');

  const metadata = await discoverAuthorizationServerMetadata(issuer);
  const refresh = (refreshToken) =>
    refreshAuthorization(issuer, {
      metadata,
      clientInformation: provider.clientInformation(),
      refreshToken,
      resource: new URL(`${issuer}/mcp`),
    });
  // The replaced token again while its successor is unused: the grace window answers a working successor.
  const graced = await refresh(first.refresh_token);
  await assertAccessToken(issuer, graced.access_token, true);
  passed('refreshAuthorization: the replaced refresh token within the grace window answers a working successor');
  // The successor used, then the replaced token again: reuse.
  const third = await refresh(graced.refresh_token);
  assert.notEqual(third.refresh_token, graced.refresh_token);
  await assertAccessToken(issuer, third.access_token, true);
  await assert.rejects(refresh(first.refresh_token), InvalidGrantError, 'reuse is invalid_grant');
  await assertAccessToken(issuer, third.access_token, false);
  await assert.rejects(refresh(third.refresh_token), InvalidGrantError, 'the family is revoked');
  passed('refreshAuthorization: reuse after the successor was used is invalid_grant and revokes the family');

  // 4. A provider without state().
  const stateless = new MemoryProvider({ redirectUrl: 'http://127.0.0.1:53683/callback' });
  stateless._onRedirect = browser({ issuer, cookie, redirectUrl: stateless.redirectUrl, provider: stateless });
  const plain = await authorizeAndConnect(issuer, stateless);
  assert.deepEqual((await plain.client.listTools()).tools.map((t) => t.name).sort(), toolNames);
  await plain.transport.close();
  passed('SDK without state(): Kiln authorizes a request without state and answers without one');
} finally {
  await kiln.stop();
}
console.log(`${counts.passed} passed, 0 failed`);
