// The consent driver every black-box OAuth test shares: it plays the person in the browser who signs in to Kiln
// and allows (or denies) a client's authorization request, over plain HTTP, the way Kiln's consent page does.
//
// 1. `signIn`: POST /api/auth/session; the session cookie `__Host-comfy_session` is `Secure`, so no cookie jar
//    sends it over http://127.0.0.1: the driver keeps the value and builds the `Cookie` header itself.
// 2. `decide`: GET the client's authorization URL without following redirects (303 to
//    `<issuer>/oauth/consent?oauth_request_id=…`), GET the consent challenge as JSON, POST the decision with the
//    challenge's CSRF token, and answer the `redirect_to` Kiln gives the browser (the client's redirect URI with
//    `code`, `state`, `iss`).
// tests/clients/test_oauth_authlib.py has the same driver in Python.
import assert from 'node:assert/strict';

/** The cookie that carries a cloud web session. */
export const sessionCookie = '__Host-comfy_session';

/** Signs `username` in at `issuer`; resolves to the `Cookie` header value that carries the session. */
export async function signIn(issuer, username, password) {
  const answer = await fetch(`${issuer}/api/auth/session`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', origin: issuer },
    body: JSON.stringify({ username, password }),
  });
  assert.equal(answer.status, 200, `sign-in answered ${answer.status}: ${await answer.text()}`);
  const set = answer.headers.getSetCookie().find((c) => c.startsWith(`${sessionCookie}=`));
  assert.ok(set, `sign-in set no ${sessionCookie} cookie`);
  assert.match(set, /;\s*Secure/i, 'the session cookie is Secure');
  return set.split(';')[0];
}

/**
 * Opens `authorizationUrl` as a signed-in browser (the `cookie` from `signIn`) and takes `decision` ("allow" or
 * "deny") on the consent page, in the workspace named `workspace` (the first one offered by default). Resolves to
 * `{ redirectTo: URL, challenge }`.
 */
export async function decide(authorizationUrl, { issuer, cookie, decision = 'allow', workspace }) {
  const authorize = await fetch(authorizationUrl, { redirect: 'manual', headers: { cookie } });
  assert.equal(authorize.status, 303, `authorize answered ${authorize.status}: ${await authorize.text()}`);
  const consentPage = new URL(authorize.headers.get('location'), issuer);
  assert.equal(`${consentPage.origin}${consentPage.pathname}`, `${issuer}/oauth/consent`, 'sent to the consent page');
  const requestId = consentPage.searchParams.get('oauth_request_id');
  assert.match(requestId ?? '', /^[0-9a-f-]{36}$/, 'the consent page names a request id');

  const challengeAnswer = await fetch(
    `${issuer}/oauth/authorize?oauth_request_id=${encodeURIComponent(requestId)}`,
    { headers: { cookie, accept: 'application/json' } },
  );
  assert.equal(challengeAnswer.status, 200, `the consent challenge answered ${challengeAnswer.status}`);
  assert.equal(challengeAnswer.headers.get('cache-control'), 'no-store');
  const challenge = await challengeAnswer.json();
  assert.equal(challenge.oauth_request_id, requestId);
  assert.equal(typeof challenge.csrf_token, 'string');
  assert.ok(challenge.workspaces.length > 0, 'the challenge offers a workspace');
  const chosen = workspace ? challenge.workspaces.find((w) => w.name === workspace) : challenge.workspaces[0];
  assert.ok(chosen, `the challenge offers the workspace ${workspace}`);

  const decided = await fetch(`${issuer}/oauth/authorize`, {
    method: 'POST',
    headers: {
      cookie,
      origin: issuer,
      'content-type': 'application/json',
      'x-csrf-token': challenge.csrf_token,
    },
    body: JSON.stringify({
      oauth_request_id: requestId,
      csrf_token: challenge.csrf_token,
      decision,
      workspace_id: chosen.id,
    }),
  });
  assert.equal(decided.status, 200, `the decision answered ${decided.status}: ${await decided.clone().text()}`);
  const { redirect_to: redirectTo } = await decided.json();
  return { redirectTo: new URL(redirectTo), challenge };
}
