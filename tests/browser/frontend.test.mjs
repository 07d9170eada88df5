// The real ComfyUI frontend (PyPI `comfyui-frontend-package`, pinned in tests/clients/requirements.txt) against
// the real `kiln` binary, in Debian's Chromium driven by playwright-core (pinned in package.json).
//
// Kiln starts as a user starts it, without --front-end-root: it downloads the pinned wheel once (here from a
// local HTTP server that serves the wheel `pip download` fetched, through --front-end-wheel-url; the test never
// reaches the internet), checks its sha256 and unpacks it into its data directory. The unpacked frontend must be
// byte for byte the `static/` folder pip installs. The page boots with no page errors, opens a
// LoadImage -> ImageInvert -> SaveImage workflow through the frontend's "open workflow" file input, clicks Run,
// waits for the run to finish and for the output image to be served by /view, and saves a screenshot for humans
// under target/browser/. Kiln runs behind the contract proxy (target/debug/kiln-contract-proxy, or
// $KILN_CONTRACT_PROXY): every answer the page gets is checked against the spec.
//
// Then two cheaper checks over HTTP: a restart with the wheel's server gone serves the cached copy, and
// --front-end-root serves the folder it names (the same serving code as the downloaded copy, so no second boot).
//
// Usage: node tests/browser/frontend.test.mjs <path to kiln> <frontend static folder> <frontend wheel>
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { basename, dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

import {
  contractProxy,
  expectedMisses,
  launchChromium,
  screenshots,
  spawnListening,
  stopProxy,
  withoutTemplates,
} from './common.mjs';

const [kilnBinary, frontEndRoot, wheelFile] = process.argv.slice(2);
if (!kilnBinary || !frontEndRoot || !wheelFile) {
  console.error('usage: frontend.test.mjs <path to kiln> <frontend static folder> <frontend wheel>');
  process.exit(2);
}
const frontendVersion = basename(wheelFile).split('-')[1];
const here = dirname(fileURLToPath(import.meta.url));

/** An API-format workflow made of Kiln's built-in nodes, as a user would save it with "Export (API)". */
const workflow = {
  1: { class_type: 'LoadImage', inputs: { image: 'kiln-input.png' } },
  2: { class_type: 'ImageInvert', inputs: { image: ['1', 0] } },
  3: { class_type: 'SaveImage', inputs: { images: ['2', 0], filename_prefix: 'browser' } },
};

/**
 * Starts kiln on a free port with a fresh data directory holding one input image and the given frontend flags,
 * behind the contract proxy (every answer and websocket frame checked against spec/openapi.yaml); resolves to
 * both and the proxy's URL.
 */
async function startKiln(dataDir, frontEndArgs) {
  mkdirSync(join(dataDir, 'input'), { recursive: true });
  copyFileSync(join(here, 'kiln-input.png'), join(dataDir, 'input', 'kiln-input.png'));
  const kiln = await spawnListening(kilnBinary, [
    '--port', '0', '--data-dir', dataDir, ...frontEndArgs, ...withoutTemplates,
  ]);
  const proxy = await spawnListening(contractProxy, [kiln.url.replace('http://', '')]);
  return { kiln: kiln.child, proxy, url: proxy.url };
}

/** Serves the wheel file at /<its name> on a free loopback port; resolves to its URL, the server and its count. */
async function serveWheel() {
  const served = { requests: 0 };
  const server = createServer((request, response) => {
    served.requests += 1;
    if (request.url !== `/${basename(wheelFile)}`) {
      response.writeHead(404).end();
      return;
    }
    const bytes = readFileSync(wheelFile);
    response.writeHead(200, { 'content-type': 'application/zip', 'content-length': bytes.length }).end(bytes);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${server.address().port}/${basename(wheelFile)}`;
  return { url, server, served };
}

/** Every file under `root`, relative to it, sorted. */
function filesUnder(root) {
  return readdirSync(root, { recursive: true, withFileTypes: true })
    .filter((entry) => entry.isFile())
    .map((entry) => relative(root, join(entry.parentPath ?? entry.path, entry.name)))
    .sort();
}

/** Asserts that two folders hold the same files with the same bytes. */
function assertSameTree(actual, expected) {
  const files = filesUnder(expected);
  assert.deepEqual(filesUnder(actual), files, `${actual} holds the files of ${expected}`);
  for (const file of files) {
    assert.ok(readFileSync(join(actual, file)).equals(readFileSync(join(expected, file))), `${file} differs`);
  }
  return files.length;
}

/** Starts kiln alone (no proxy) with `args`, runs `check(url)`, and stops it. */
async function withKiln(args, check) {
  const { child, url } = await spawnListening(kilnBinary, ['--port', '0', ...args, ...withoutTemplates]);
  try {
    await check(url);
  } finally {
    child.kill('SIGKILL');
  }
}

/** Resolves to the first websocket text frame whose JSON `type` is `type` and that satisfies `accept`. */
function waitForFrame(page, type, accept = () => true) {
  return new Promise((resolve) => {
    page.on('websocket', (socket) => {
      socket.on('framereceived', ({ payload }) => {
        if (typeof payload !== 'string') return;
        const message = JSON.parse(payload);
        if (message.type === type && accept(message.data)) resolve(message.data);
      });
    });
  });
}

const dataDir = mkdtempSync(join(tmpdir(), 'kiln-browser-'));
const rootDataDir = mkdtempSync(join(tmpdir(), 'kiln-browser-root-'));
process.on('exit', () => {
  for (const dir of [dataDir, rootDataDir]) rmSync(dir, { recursive: true, force: true });
});
const wheel = await serveWheel();
// The default path: no --front-end-root; the pinned wheel is downloaded (from the local server) and unpacked.
const { kiln, proxy, url } = await startKiln(dataDir, ['--front-end-wheel-url', wheel.url]);
const installed = join(dataDir, 'frontend', `comfyui-frontend-package-${frontendVersion}`);
assert.equal(wheel.served.requests, 1, 'kiln downloaded the wheel once');
const installedFiles = assertSameTree(installed, frontEndRoot);
const browser = await launchChromium();
const problems = [];
let ran;
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  page.on('response', (response) => {
    const address = response.url();
    if (!address.startsWith(url) || response.status() < 400) return;
    if (response.status() >= 500 || !expectedMisses.some((miss) => miss.test(address))) {
      problems.push(`${response.request().method()} ${address} answered ${response.status()}`);
    }
  });
  const executionDone = waitForFrame(page, 'execution_success');
  const executed = waitForFrame(page, 'executed', (data) => data.node === '3');

  // Boot: the app object exists and the Run button is there.
  await page.goto(url + '/');
  await page.waitForFunction(() => window.app?.graph !== undefined, null, { timeout: 60_000 });
  // A fresh install greets the user with the template browser (a modal dialog); close it as a user would.
  const templates = page.getByRole('dialog');
  await templates.waitFor({ timeout: 30_000 });
  await page.keyboard.press('Escape');
  await templates.waitFor({ state: 'detached', timeout: 10_000 });
  const run = page.getByRole('button', { name: 'Run', exact: true });
  await run.waitFor({ timeout: 30_000 });

  // Open the workflow file the way the frontend's "Open" menu does.
  const workflowFile = join(dataDir, 'invert_api.json');
  writeFileSync(workflowFile, JSON.stringify(workflow));
  await page.setInputFiles('#comfy-file-input', workflowFile);
  await page.waitForFunction(() => window.app.graph.nodes.length === 3, null, { timeout: 30_000 });
  const types = await page.evaluate(() => window.app.graph.nodes.map((node) => node.type).sort());
  assert.deepEqual(types, ['ImageInvert', 'LoadImage', 'SaveImage']);

  // Run it and watch the frontend fetch the output from /view.
  const outputServed = page.waitForResponse(
    (response) => response.url().includes('/api/view?') && response.url().includes('type=output'),
    { timeout: 60_000 },
  );
  await run.click();
  const { output } = await executed;
  await executionDone;
  assert.equal(output.images.length, 1, 'SaveImage reports one image');
  const [image] = output.images;
  assert.match(image.filename, /^browser_\d{5}_\.png$/);
  const served = await outputServed;
  assert.equal(served.status(), 200, '/view serves the output');
  assert.equal(served.headers()['content-type'], 'image/png');
  const bytes = await served.body();
  assert.deepEqual([...bytes.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47], 'the output is a PNG');

  // The history the queue panel reads agrees.
  const history = await (await fetch(`${url}/api/history`)).json();
  const [entry] = Object.values(history);
  assert.equal(entry.status.status_str, 'success');
  assert.deepEqual(entry.outputs['3'].images, [image]);

  await page.waitForTimeout(500); // let the canvas draw the output preview
  mkdirSync(screenshots, { recursive: true });
  await page.screenshot({ path: join(screenshots, 'frontend-run.png') });
  assert.deepEqual(problems, [], 'no page errors and no unexpected 4xx/5xx');
  ran = image.filename;
} finally {
  await browser.close();
  const contract = await stopProxy(proxy);
  kiln.kill('SIGKILL');
  console.log(contract.report.split('\n')[0]);
  assert.equal(contract.code, 0, `kiln sent answers the spec does not describe:\n${contract.report}`);
}

// A later start, with the wheel's server gone (as offline): the cached copy is served, nothing is fetched.
await new Promise((resolve) => wheel.server.close(resolve));
const index = readFileSync(join(frontEndRoot, 'index.html'));
await withKiln(['--data-dir', dataDir, '--front-end-wheel-url', wheel.url], async (kilnUrl) => {
  const page = await fetch(`${kilnUrl}/`);
  assert.equal(page.status, 200, 'the cached frontend is served');
  assert.ok(Buffer.from(await page.arrayBuffer()).equals(index), 'the cached index.html');
});
assert.equal(wheel.served.requests, 1, 'the restart made no download');

// --front-end-root serves the folder it names, and downloads nothing (a fresh data directory stays without one).
await withKiln(['--data-dir', rootDataDir, '--front-end-root', frontEndRoot], async (kilnUrl) => {
  const page = await fetch(`${kilnUrl}/`);
  assert.equal(page.status, 200);
  assert.equal(page.headers.get('cache-control'), 'no-store, must-revalidate');
  assert.ok(Buffer.from(await page.arrayBuffer()).equals(index), '--front-end-root serves its index.html');
  const script = index.toString().match(/src="\.?\/?(assets\/[^"]+\.js)"/)?.[1];
  assert.ok(script, 'index.html loads a script from assets/');
  const asset = await fetch(`${kilnUrl}/${script}`);
  assert.equal(asset.status, 200, `${script} is served`);
  assert.ok(Buffer.from(await asset.arrayBuffer()).equals(readFileSync(join(frontEndRoot, script))));
});
assert.equal(readdirSync(rootDataDir).includes('frontend'), false, '--front-end-root downloads nothing');
console.log(
  `ok: kiln downloaded the pinned ComfyUI frontend ${frontendVersion} (${installedFiles} files, as pip installs them), ` +
    `which ran ${ran}; screenshot in target/browser/frontend-run.png; the cached copy and --front-end-root are served`,
);
