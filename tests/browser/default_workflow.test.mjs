// Issue #11 in the browser: the ComfyUI frontend's own default workflow (Z-Image-Turbo) runs on Kiln.
//
// Before kiln starts, `kiln model synth --size tiny` writes tiny random-weight files under the released names
// (diffusion_models/z_image_turbo_bf16.safetensors, text_encoders/qwen_3_4b.safetensors, vae/ae.safetensors)
// into a fresh data directory. The frontend (the pinned package's static folder, through --front-end-root; the
// download path is frontend.test.mjs's) then boots in Chromium, driven by playwright-core, behind the contract
// proxy (every answer and websocket frame checked against spec/openapi.yaml).
//
// How the frontend (1.58.1) picks its graph: a brand-new user (setting Comfy.TutorialCompleted unset) gets a
// blank canvas and the template browser, and the frontend stores Comfy.TutorialCompleted = true on the server;
// a user with that setting and no workflow saved in the browser gets the default graph (`loadGraphData()` with
// no workflow). So the test boots once as a new user, closes the template browser, and opens Kiln again in a
// fresh browser profile: the frontend loads its default graph by itself, and the test checks it is the
// Z-Image-Turbo graph of models.md §1.1, widget by widget.
//
// The one change: the default 1024x1024 at 8 steps takes minutes on tiny models in a debug build on a CPU, so
// the test sets the EmptySD3LatentImage width/height and the KSampler steps through the frontend's own widgets
// (96x64 at 2 steps, about 7 s; $KILN_BROWSER_SIZE=WxH and $KILN_BROWSER_STEPS change them: 256x256 at 8 steps
// takes about a minute, 1024x1024 at 8 steps, the graph unchanged, more than ten). Then it presses the real Run
// button, waits for the KSampler's progress events and the SaveImage output, fetches the image through /view,
// checks it is a PNG of the chosen size, and saves screenshots under target/browser/.
//
// Usage: node tests/browser/default_workflow.test.mjs <path to kiln> <frontend static folder>
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
  console.error('usage: default_workflow.test.mjs <path to kiln> <frontend static folder>');
  process.exit(2);
}
// Width x height: not square, so a swapped pair shows.
const [width, height] = (process.env.KILN_BROWSER_SIZE ?? '96x64').split('x').map(Number);
const steps = Number(process.env.KILN_BROWSER_STEPS ?? 2);
const runTimeout = Number(process.env.KILN_BROWSER_RUN_TIMEOUT_S ?? 600) * 1000;

/**
 * The frontend's default graph (src/scripts/defaultGraph.ts, `prodDefaultGraph`) as node id -> type and
 * widget values: models.md §1.1.
 */
const defaultGraph = {
  9: ['SaveImage', ['ComfyUI']],
  62: ['CLIPLoader', ['qwen_3_4b.safetensors', 'lumina2', 'default']],
  63: ['VAELoader', ['ae.safetensors']],
  65: ['VAEDecode', []],
  66: ['UNETLoader', ['z_image_turbo_bf16.safetensors', 'default']],
  67: ['CLIPTextEncode', [/^anime RPG game style, cute anime girl with gigantic fennec ears/]],
  68: ['EmptySD3LatentImage', [1024, 1024, 1]],
  69: ['ModelSamplingAuraFlow', [3]],
  70: ['KSampler', [42, 'fixed', 8, 1, 'res_multistep', 'simple', 1]],
  71: ['CLIPTextEncode', [/^low quality, bad anatomy/]],
};

/** The default graph's links, as the API prompt carries them: `node.input` -> [source node, output slot]. */
const defaultLinks = {
  '9.images': ['65', 0],
  '65.samples': ['70', 0],
  '65.vae': ['63', 0],
  '67.clip': ['62', 0],
  '69.model': ['66', 0],
  '70.model': ['69', 0],
  '70.positive': ['67', 0],
  '70.negative': ['71', 0],
  '70.latent_image': ['68', 0],
  '71.clip': ['62', 0],
};

/** Width and height from a PNG's IHDR chunk. */
function pngSize(bytes) {
  assert.deepEqual([...bytes.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 'a PNG');
  assert.equal(bytes.subarray(12, 16).toString('latin1'), 'IHDR');
  return [bytes.readUInt32BE(16), bytes.readUInt32BE(20)];
}

/** A new page in `context` that records page errors and unexpected 4xx/5xx answers from `url` into `problems`. */
async function openKiln(context, url, problems) {
  const page = await context.newPage();
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  recordUnexpectedAnswers(page, url, problems);
  return page;
}

const dataDir = mkdtempSync(join(tmpdir(), 'kiln-browser-default-'));
process.on('exit', () => rmSync(dataDir, { recursive: true, force: true }));

// The tiny files under the real names, written by the binary itself.
let started = Date.now();
// Its log goes into the error if it fails.
execFileSync(kilnBinary, ['model', 'synth', '--size', 'tiny', '--models-dir', join(dataDir, 'models')], {
  stdio: ['ignore', 'ignore', 'pipe'],
});
const synthSeconds = (Date.now() - started) / 1000;

const kiln = await spawnListening(kilnBinary, [
  '--port', '0', '--data-dir', dataDir, '--front-end-root', frontEndRoot, ...withoutTemplates,
]);
const proxy = await spawnListening(contractProxy, [kiln.url.replace('http://', '')]);
const { url } = proxy;
const browser = await launchChromium();
const problems = [];
let runSeconds;
let progressSteps;
try {
  // Wide enough that the whole graph, fitted into view for the screenshot, is drawn with its text.
  const viewport = { width: 1920, height: 1080 };

  // 1. A new user: a blank canvas and the template browser; closing it leaves the tutorial marked as done.
  const first = await browser.newContext({ viewport });
  const newUser = await openKiln(first, url, problems);
  await newUser.goto(url + '/');
  await newUser.waitForFunction(() => window.app?.graph !== undefined, null, { timeout: 60_000 });
  const templates = newUser.getByRole('dialog');
  await templates.waitFor({ timeout: 30_000 });
  await newUser.keyboard.press('Escape');
  await templates.waitFor({ state: 'detached', timeout: 10_000 });
  assert.equal(await newUser.evaluate(() => window.app.graph.nodes.length), 0, 'a new user starts blank');
  const settings = await (await fetch(`${url}/api/settings`)).json();
  assert.equal(settings['Comfy.TutorialCompleted'], true, 'the frontend stored that the user has been here');
  await first.close();

  // 2. The same user in a fresh browser profile (nothing saved in the browser): the default graph.
  const context = await browser.newContext({ viewport });
  const page = await openKiln(context, url, problems);
  const frames = [];
  recordFrames(page, frames);
  await page.goto(url + '/');
  await page.waitForFunction(() => window.app?.graph?.nodes.length > 0, null, { timeout: 60_000 });
  const run = page.getByRole('button', { name: 'Run', exact: true });
  await run.waitFor({ timeout: 30_000 });
  const loaded = await page.evaluate(() =>
    Object.fromEntries(
      window.app.graph.nodes.map((node) => [
        node.id,
        [node.type, (node.widgets ?? []).map((widget) => widget.value)],
      ]),
    ),
  );
  assert.deepEqual(Object.keys(loaded).sort(), Object.keys(defaultGraph).sort(), 'the default graph nodes');
  for (const [id, [type, values]] of Object.entries(defaultGraph)) {
    assert.equal(loaded[id][0], type, `node ${id} is a ${type}`);
    assert.equal(loaded[id][1].length, values.length, `node ${id} (${type}) widgets: ${loaded[id][1]}`);
    values.forEach((expected, i) => {
      const actual = loaded[id][1][i];
      if (expected instanceof RegExp) assert.match(actual, expected, `node ${id} widget ${i}`);
      else assert.equal(actual, expected, `node ${id} (${type}) widget ${i}`);
    });
  }
  await page.waitForTimeout(300);
  mkdirSync(screenshots, { recursive: true });
  await page.screenshot({ path: join(screenshots, 'default-workflow-loaded.png') });

  // 3. Smaller image and fewer steps, set through the nodes' own widgets as a user would type them.
  await page.evaluate(
    ([width, height, steps]) => {
      const node = (id) => window.app.graph.getNodeById(id);
      const widget = (id, name) => node(id).widgets.find((w) => w.name === name);
      for (const [id, name, value] of [
        [68, 'width', width],
        [68, 'height', height],
        [70, 'steps', steps],
      ]) {
        const w = widget(id, name);
        w.value = value;
        w.callback?.(value, window.app.canvas, node(id));
      }
      window.app.graph.setDirtyCanvas(true, true);
    },
    [width, height, steps],
  );

  // 4. Run, as a user does.
  const outputServed = page.waitForResponse(
    (response) => response.url().includes('/api/view?') && response.url().includes('type=output'),
    { timeout: runTimeout },
  );
  const promptSent = page.waitForRequest(
    (request) => request.url().endsWith('/api/prompt') && request.method() === 'POST',
  );
  started = Date.now();
  await run.click();
  const sent = (await promptSent).postDataJSON().prompt;
  assert.deepEqual(
    Object.fromEntries(Object.entries(sent).map(([id, node]) => [id, node.class_type])),
    Object.fromEntries(Object.entries(defaultGraph).map(([id, [type]]) => [id, type])),
    'the prompt is the default graph',
  );
  const sentLinks = Object.entries(sent).flatMap(([id, node]) =>
    Object.entries(node.inputs)
      .filter(([, value]) => Array.isArray(value))
      .map(([input, from]) => [`${id}.${input}`, from]),
  );
  assert.deepEqual(Object.fromEntries(sentLinks), defaultLinks, 'the default graph wiring');
  assert.equal(sent['68'].inputs.width, width);
  assert.equal(sent['68'].inputs.height, height);
  assert.equal(sent['70'].inputs.steps, steps);
  assert.equal(sent['70'].inputs.sampler_name, 'res_multistep');
  const finished = await frameMatching(
    frames,
    (f) => f.type === 'execution_success' || f.type === 'execution_error',
    runTimeout,
  );
  runSeconds = (Date.now() - started) / 1000;
  const served = await outputServed;
  assert.equal(finished?.type, 'execution_success', `the run succeeded: ${JSON.stringify(finished)}`);
  const executed = frames.find((f) => f.type === 'executed' && f.data.node === '9');
  assert.ok(executed, 'SaveImage reported its output');
  const [image] = executed.data.output.images;
  assert.match(image.filename, /^ComfyUI_\d{5}_\.png$/);
  assert.equal(image.type, 'output');

  // The KSampler reported each step.
  const progress = frames.filter((f) => f.type === 'progress' && f.data.node === '70');
  progressSteps = progress.map((f) => f.data.value);
  assert.deepEqual(progressSteps, Array.from({ length: steps }, (_, i) => i + 1), 'KSampler progress');
  assert.ok(progress.every((f) => f.data.max === steps));

  // The image the page shows, served by /view: a PNG of the chosen size.
  assert.equal(served.status(), 200, '/view serves the output');
  assert.equal(served.headers()['content-type'], 'image/png');
  assert.ok(served.url().includes(`filename=${image.filename}`), served.url());
  assert.deepEqual(pngSize(await served.body()), [width, height], 'the PNG has the chosen size');
  const view = await fetch(`${url}/api/view?filename=${image.filename}&type=output&subfolder=`);
  assert.equal(view.status, 200);
  assert.deepEqual(pngSize(Buffer.from(await view.arrayBuffer())), [width, height]);

  // The history the queue panel reads agrees.
  const history = await (await fetch(`${url}/api/history`)).json();
  const [entry] = Object.values(history);
  assert.equal(entry.status.status_str, 'success');
  assert.deepEqual(entry.outputs['9'].images, [image]);

  // Fit the whole graph into view (the "." shortcut) so the screenshot shows SaveImage's preview.
  await page.locator('#graph-canvas').click({ position: { x: 700, y: 110 } });
  await page.keyboard.press('.');
  await page.waitForTimeout(500); // let the canvas draw the output preview
  await page.screenshot({ path: join(screenshots, 'default-workflow-run.png') });
  assert.deepEqual(problems, [], 'no page errors and no unexpected 4xx/5xx');
} finally {
  await shutDown({ browser, proxy, kiln });
}
console.log(
  `ok: the frontend's default Z-Image-Turbo workflow ran on tiny synthetic files ` +
    `(synth ${synthSeconds.toFixed(1)} s) at ${width}x${height}, ${steps} steps in ${runSeconds.toFixed(1)} s ` +
    `(KSampler progress ${progressSteps.join(',')}); ` +
    'screenshots in target/browser/default-workflow-{loaded,run}.png',
);
