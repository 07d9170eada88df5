// Issue #20 in the browser: a brand-new user of Kiln sees ComfyUI's official workflow templates.
//
// Kiln starts on a fresh data directory as a user's first start does: it downloads the pinned
// `comfyui-workflow-templates` packages (here from a loopback server over the wheels `pip download` fetched from
// tests/templates/requirements.txt, through --templates-wheels-url; the test never reaches the internet), checks
// their sha256 and unpacks them into the data directory in the background. The frontend (the pinned package's
// static folder, through --front-end-root) boots in Chromium, driven by playwright-core, behind the contract
// proxy. A new user gets the template browser: the test waits for its cards and their thumbnails (served from
// /templates/), opens the Z-Image-Turbo template by clicking its card, and checks that the template's graph is on
// the canvas; every /templates/ file the page asks for is served. Then a restart serves the installed copy without
// a request to the wheels' server.
//
// Usage: node tests/browser/templates.test.mjs <path to kiln> <frontend static folder> <folder of the wheels>
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import {
  contractProxy,
  expectedMisses,
  launchChromium,
  recordUnexpectedAnswers,
  screenshots,
  serveFolder,
  shutDown,
  spawnListening,
  templatesInstalled,
} from './common.mjs';

const [kilnBinary, frontEndRoot, wheelsDir] = process.argv.slice(2);
if (!kilnBinary || !frontEndRoot || !wheelsDir) {
  console.error('usage: templates.test.mjs <path to kiln> <frontend static folder> <folder of the wheels>');
  process.exit(2);
}
const template = 'image_z_image_turbo';

const dataDir = mkdtempSync(join(tmpdir(), 'kiln-browser-templates-'));
process.on('exit', () => rmSync(dataDir, { recursive: true, force: true }));
const wheels = await serveFolder(wheelsDir);
const args = ['--port', '0', '--data-dir', dataDir, '--front-end-root', frontEndRoot, '--templates-wheels-url', wheels.url];
const kiln = await spawnListening(kilnBinary, args);
const proxy = await spawnListening(contractProxy, [kiln.url.replace('http://', '')]);
const { url } = proxy;
const browser = await launchChromium();
const problems = [];
let thumbnails;
let installSeconds;
try {
  // The download runs in the background: the API answers at once, and says when the templates are in.
  let started = Date.now();
  const system = await templatesInstalled(url, 600_000);
  installSeconds = (Date.now() - started) / 1000;
  assert.equal(system.installed_templates_version, system.required_templates_version);
  const packages = system.comfy_package_versions.find((p) => p.name === 'comfyui-workflow-templates');
  assert.deepEqual(packages, {
    name: 'comfyui-workflow-templates',
    installed: system.required_templates_version,
    required: system.required_templates_version,
  });
  assert.equal(wheels.served.requests, 8, 'the eight pinned packages, each downloaded once');
  assert.ok(kiln.log.some((line) => line.includes('installed the workflow templates')), kiln.log.join('\n'));

  // A brand-new user: a blank canvas and the template browser, with the templates and their thumbnails.
  const context = await browser.newContext({ viewport: { width: 1920, height: 1080 } });
  const page = await context.newPage();
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  // Unlike a ComfyUI without the templates package, no /templates/ file may be missing.
  const misses = expectedMisses.filter((miss) => !miss.test('/templates/index.json'));
  recordUnexpectedAnswers(page, url, problems, misses);
  const templateAnswers = [];
  page.on('response', (response) => {
    if (response.url().startsWith(`${url}/templates/`)) templateAnswers.push([response.url(), response.status()]);
  });
  await page.goto(`${url}/`);
  await page.waitForFunction(() => window.app?.graph !== undefined, null, { timeout: 60_000 });
  const dialog = page.getByRole('dialog');
  await dialog.waitFor({ timeout: 30_000 });
  const card = page.getByTestId(`template-workflow-${template}`);
  await card.waitFor({ timeout: 30_000 });
  await page.waitForFunction(
    () => [...document.querySelectorAll('[role=dialog] img')].filter((i) => i.complete && i.naturalWidth > 0).length >= 8,
    null,
    { timeout: 60_000 },
  );
  thumbnails = await page.evaluate(
    () => [...document.querySelectorAll('[role=dialog] img')].filter((i) => i.complete && i.naturalWidth > 0).length,
  );
  const index = templateAnswers.find(([address]) => address.endsWith('/templates/index.json'));
  assert.deepEqual(index?.[1], 200, 'the template browser read /templates/index.json');
  const webp = templateAnswers.filter(([address, status]) => address.endsWith('.webp') && status === 200);
  assert.ok(webp.length >= 8, `thumbnails served from /templates/: ${JSON.stringify(templateAnswers)}`);
  // Every partner logo the browser's index names is served (they sit in a folder: `logo/bfl.png`).
  const logos = Object.values(await (await fetch(`${url}/templates/index_logo.json`)).json());
  assert.ok(logos.length > 0, 'index_logo.json names the logos');
  for (const logo of logos) {
    const answer = await fetch(`${url}/templates/${logo}`);
    assert.equal(answer.status, 200, `/templates/${logo}`);
    await answer.arrayBuffer();
  }
  mkdirSync(screenshots, { recursive: true });
  await page.screenshot({ path: join(screenshots, 'templates-browser.png') });

  // Opening a template puts its graph on the canvas.
  const workflow = await (await fetch(`${url}/templates/${template}.json`)).json();
  await card.click();
  await dialog.waitFor({ state: 'detached', timeout: 30_000 });
  await page.waitForFunction((n) => window.app.graph.nodes.length === n, workflow.nodes.length, { timeout: 30_000 });
  const onCanvas = await page.evaluate(() =>
    window.app.graph.nodes.map((n) => [String(n.id), n.type, n.subgraph?.nodes.map((i) => i.type).sort() ?? null]),
  );
  const subgraphs = new Map(workflow.definitions.subgraphs.map((s) => [s.id, s.nodes.map((n) => n.type).sort()]));
  const byId = (a, b) => a[0].localeCompare(b[0]);
  assert.deepEqual(
    onCanvas.sort(byId),
    workflow.nodes.map((n) => [String(n.id), n.type, subgraphs.get(n.type) ?? null]).sort(byId),
    'the template graph, its subgraph expanded',
  );
  assert.ok(onCanvas.some(([, , inner]) => inner?.includes('UNETLoader')), 'Z-Image-Turbo inside its subgraph');
  await page.waitForTimeout(500);
  await page.screenshot({ path: join(screenshots, 'templates-opened.png') });
  assert.deepEqual(problems, [], 'no page errors and no unexpected 4xx/5xx');
} finally {
  await shutDown({ browser, proxy, kiln });
}

// A restart: the installed templates are served, and the wheels' server (still up) gets no request.
const requestsBefore = wheels.served.requests;
const again = await spawnListening(kilnBinary, args);
try {
  const system = await templatesInstalled(again.url, 10_000);
  assert.ok(system.installed_templates_version);
  const index = await fetch(`${again.url}/templates/index.json`);
  assert.equal(index.status, 200);
  assert.match(index.headers.get('content-type'), /^application\/json/);
  const end = Date.now() + 10_000;
  while (!again.log.some((line) => line.includes('serving the workflow templates')) && Date.now() < end) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  assert.ok(again.log.some((line) => line.includes('serving the workflow templates')), again.log.join('\n'));
  assert.equal(wheels.served.requests, requestsBefore, 'the installed copy is used without a request');
} finally {
  again.child.kill('SIGKILL');
  wheels.server.close();
}
console.log(
  `ok: a fresh data dir installed the workflow templates in ${installSeconds.toFixed(1)} s; the template ` +
    `browser showed them with ${thumbnails} thumbnails loaded, and opening ${template} put its graph on the ` +
    'canvas; a restart served the installed copy; screenshots in target/browser/templates-{browser,opened}.png',
);
