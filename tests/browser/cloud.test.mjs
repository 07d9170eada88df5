// Issue #12 in the browser: the real ComfyUI frontend behind `kiln --runtime cloud`.
//
// `kiln user add` creates a user (password on stdin) in a fresh data directory; kiln starts with
// `--runtime cloud --front-end-root` behind the contract proxy in its cloud mode (every answer and websocket
// frame checked against the cloud runtime's operations). In Chromium, driven by playwright-core:
// 1. a browser without a session that opens `/` is sent to `/login`, and the API answers it 401;
// 2. a wrong password shows the error on the sign-in page; the right one lands on the frontend;
// 3. the frontend boots with the session cookie: its writes (settings) carry the CSRF token Kiln's script adds,
//    and nothing answers an unexpected 4xx/5xx;
// 4. a workflow (EmptyImage -> ImageInvert -> SaveImage, loaded through the frontend's own `loadApiJson`) runs
//    when Run is pressed: its events arrive on the page's websocket and its image is served by /view;
// 5. a write without the CSRF token is refused (403), and signing out ends the session (401 afterwards).
//
// Usage: node tests/browser/cloud.test.mjs <path to kiln> <frontend static folder>
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import {
  contractProxy,
  frameMatching,
  launchChromium,
  recordFrames,
  recordUnexpectedAnswers,
  screenshots,
  spawnListening,
  shutDown,
  withoutTemplates,
} from './common.mjs';

const [kilnBinary, frontEndRoot] = process.argv.slice(2);
if (!kilnBinary || !frontEndRoot) {
  console.error('usage: cloud.test.mjs <path to kiln> <frontend static folder>');
  process.exit(2);
}

const password = 'a long enough password';
const workflow = {
  1: { class_type: 'EmptyImage', inputs: { width: 48, height: 32, batch_size: 1, color: 0x336699 } },
  2: { class_type: 'ImageInvert', inputs: { image: ['1', 0] } },
  3: { class_type: 'SaveImage', inputs: { images: ['2', 0], filename_prefix: 'cloud' } },
};

const dataDir = mkdtempSync(join(tmpdir(), 'kiln-browser-cloud-'));
process.on('exit', () => rmSync(dataDir, { recursive: true, force: true }));
execFileSync(kilnBinary, ['user', 'add', 'alice', '--data-dir', dataDir], {
  input: `${password}\n`,
  stdio: ['pipe', 'ignore', 'pipe'],
});

const kiln = await spawnListening(kilnBinary, [
  '--runtime',
  'cloud',
  '--port',
  '0',
  '--data-dir',
  dataDir,
  '--front-end-root',
  frontEndRoot,
  ...withoutTemplates,
]);
const proxy = await spawnListening(contractProxy, [kiln.url.replace('http://', ''), 'cloud']);
const { url } = proxy;
const browser = await launchChromium();
const problems = [];
let runSeconds;
try {
  // 1. No session: the frontend sends the browser to sign in, and the API refuses it.
  const anonymous = await fetch(`${url}/api/queue`);
  assert.equal(anonymous.status, 401);
  assert.equal(anonymous.headers.get('cache-control'), 'no-store');

  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  const frames = [];
  recordFrames(page, frames);
  await page.goto(url + '/');
  assert.equal(new URL(page.url()).pathname, '/login', 'sent to sign in');

  // 2. A wrong password is shown; the right one signs in and opens the frontend.
  await page.getByLabel('User name').fill('alice');
  await page.getByLabel('Password').fill('not the password');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('alert').filter({ hasText: 'wrong password' }).waitFor({ timeout: 10_000 });
  recordUnexpectedAnswers(page, url, problems);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.waitForURL(`${url}/`, { timeout: 10_000 });
  const cookies = await context.cookies();
  const session = cookies.find((c) => c.name === '__Host-comfy_session');
  assert.ok(session, 'the session cookie is set');
  assert.equal(session.httpOnly, true);
  assert.equal(session.secure, true);
  assert.equal(session.sameSite, 'Lax');

  // 3. The frontend boots with the cookie; a new user gets the template browser, closing it stores a setting
  // (a cookie write, which needs the CSRF token the script adds).
  await page.waitForFunction(() => window.app?.graph !== undefined, null, { timeout: 60_000 });
  const settingStored = page.waitForResponse(
    (response) => response.url().includes('/api/settings') && response.request().method() === 'POST',
    { timeout: 30_000 },
  );
  const templates = page.getByRole('dialog');
  await templates.waitFor({ timeout: 30_000 });
  await page.keyboard.press('Escape');
  assert.equal((await settingStored).status(), 200, 'the frontend stores settings with the session');
  const stored = await page.evaluate(async () => (await fetch('/api/settings')).json());
  assert.equal(stored['Comfy.TutorialCompleted'], true);

  // 4. A workflow loaded through the frontend runs when Run is pressed.
  await page.evaluate((prompt) => window.app.loadApiJson(prompt, 'cloud.json'), workflow);
  await page.waitForFunction(() => window.app.graph.nodes.length === 3, null, { timeout: 10_000 });
  const outputServed = page.waitForResponse(
    (response) => response.url().includes('/api/view?') && response.url().includes('type=output'),
    { timeout: 60_000 },
  );
  const run = page.getByRole('button', { name: 'Run', exact: true });
  const started = Date.now();
  await run.click();
  const served = await outputServed;
  runSeconds = (Date.now() - started) / 1000;
  assert.equal(served.status(), 200, '/view serves the output to the signed-in user');
  assert.equal(served.headers()['content-type'], 'image/png');
  // The page fetches the image on `executed`; `execution_success` follows once the history is stored.
  const finished = await frameMatching(
    frames,
    (f) => f.type === 'execution_success' || f.type === 'execution_error',
    30_000,
  );
  assert.equal(finished.type, 'execution_success', `the run succeeded: ${JSON.stringify(finished)}`);
  const executed = frames.find((f) => f.type === 'executed' && f.data.node === '3');
  assert.match(executed.data.output.images[0].filename, /^cloud_\d{5}_\.png$/);
  // The image belongs to the workspace: the API without the session does not serve it.
  const outsider = await fetch(
    `${url}/api/view?filename=${executed.data.output.images[0].filename}&type=output`,
  );
  assert.equal(outsider.status, 401);
  mkdirSync(screenshots, { recursive: true });
  await page.screenshot({ path: join(screenshots, 'cloud-run.png') });

  assert.deepEqual(problems, [], 'no page errors and no unexpected 4xx/5xx while signed in');

  // 5. A write without the token is refused; signing out ends the session.
  // (From outside the page: in it, Kiln's script adds the token to every write.)
  const withCookie = { cookie: `__Host-comfy_session=${session.value}` };
  for (const headers of [withCookie, { ...withCookie, 'x-csrf-token': 'forged' }]) {
    const refused = await fetch(`${url}/api/interrupt`, { method: 'POST', headers });
    assert.equal(refused.status, 403);
    assert.equal((await refused.json()).code, 'csrf_invalid');
  }
  const signedOut = await page.evaluate(async () => {
    const { csrf_token: token } = await (await fetch('/api/auth/session')).json();
    const out = await fetch('/api/auth/session', { method: 'DELETE', headers: { 'X-CSRF-Token': token } });
    const after = await fetch('/api/auth/session');
    return [out.status, after.status];
  });
  assert.deepEqual(signedOut, [200, 401]);
} finally {
  await shutDown({ browser, proxy, kiln });
}
console.log(
  `ok: signed in through /login, the frontend booted with the session and ran a workflow in ` +
    `${runSeconds.toFixed(1)} s; screenshot in target/browser/cloud-run.png`,
);
