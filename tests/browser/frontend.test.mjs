// The real ComfyUI frontend (PyPI `comfyui-frontend-package`, pinned in tests/clients/requirements.txt) against
// the real `kiln` binary, in Debian's Chromium driven by playwright-core (pinned in package.json).
//
// Boots the page with no page errors, opens a LoadImage -> ImageInvert -> SaveImage workflow through the
// frontend's "open workflow" file input, clicks Run, waits for the run to finish and for the output image to be
// served by /view, and saves a screenshot for humans under target/browser/. Kiln runs behind the contract proxy
// (target/debug/kiln-contract-proxy, or $KILN_CONTRACT_PROXY): every answer the page gets is checked against
// the spec.
//
// Usage: node tests/browser/frontend.test.mjs <path to kiln> <frontend static folder>
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const [kilnBinary, frontEndRoot] = process.argv.slice(2);
if (!kilnBinary || !frontEndRoot) {
  console.error('usage: frontend.test.mjs <path to kiln> <frontend static folder>');
  process.exit(2);
}
const here = dirname(fileURLToPath(import.meta.url));
const screenshots = join(here, '..', '..', 'target', 'browser');
const chromiumPath = process.env.KILN_CHROMIUM ?? '/usr/bin/chromium';
const contractProxy =
  process.env.KILN_CONTRACT_PROXY ?? join(here, '..', '..', 'target', 'debug', 'kiln-contract-proxy');

// What a fresh ComfyUI install also answers with 4xx while the frontend boots: no user.css, no saved workflows or
// subgraphs yet, no templates package. Any other 4xx, and every 5xx, fails the test.
const expectedMisses = [
  /\/user\.css$/,
  /\/api\/userdata\/user\.css$/,
  /\/api\/userdata\/comfy\.templates\.json$/,
  /\/api\/userdata\?dir=(workflows|subgraphs)&/,
  /\/templates\//,
];

/** An API-format workflow made of Kiln's built-in nodes, as a user would save it with "Export (API)". */
const workflow = {
  1: { class_type: 'LoadImage', inputs: { image: 'kiln-input.png' } },
  2: { class_type: 'ImageInvert', inputs: { image: ['1', 0] } },
  3: { class_type: 'SaveImage', inputs: { images: ['2', 0], filename_prefix: 'browser' } },
};

/** Spawns `command args`; resolves to the process and the `http://host:port` it logs as listening on. */
async function spawnListening(command, args) {
  const child = spawn(command, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  const lines = createInterface({ input: child.stderr });
  const url = await new Promise((resolve, reject) => {
    child.on('exit', (code) => reject(new Error(`${command} exited with ${code} before listening`)));
    lines.on('line', (line) => {
      const found = line.match(/listening on (http:\/\/\S+)/);
      if (found) resolve(found[1]);
    });
  });
  return { child, url, lines };
}

/**
 * Starts kiln on a free port with a fresh data directory holding one input image, behind the contract proxy
 * (every answer and websocket frame checked against spec/openapi.yaml); resolves to both and the proxy's URL.
 */
async function startKiln(dataDir) {
  mkdirSync(join(dataDir, 'input'), { recursive: true });
  copyFileSync(join(here, 'kiln-input.png'), join(dataDir, 'input', 'kiln-input.png'));
  const kiln = await spawnListening(kilnBinary, ['--port', '0', '--data-dir', dataDir, '--front-end-root', frontEndRoot]);
  const proxy = await spawnListening(contractProxy, [kiln.url.replace('http://', '')]);
  return { kiln: kiln.child, proxy, url: proxy.url };
}

/** Stops the proxy; resolves to its exit code and its report (answers checked, violations). */
async function stopProxy({ child, lines }) {
  const report = [];
  lines.on('line', (line) => report.push(line));
  const code = await new Promise((resolve) => {
    child.on('exit', resolve);
    child.kill('SIGTERM');
  });
  return { code, report: report.join('\n') };
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
const { kiln, proxy, url } = await startKiln(dataDir);
const browser = await chromium.launch({
  executablePath: chromiumPath,
  args: [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
});
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
  rmSync(dataDir, { recursive: true, force: true });
  console.log(contract.report.split('\n')[0]);
  assert.equal(contract.code, 0, `kiln sent answers the spec does not describe:\n${contract.report}`);
}
console.log(`ok: ComfyUI frontend ran ${ran} on kiln; screenshot in target/browser/frontend-run.png`);
