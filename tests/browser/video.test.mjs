// Issue #24 in the browser: the ComfyUI frontend plays the videos Kiln made.
//
// The frontend (the pinned package's static folder, through --front-end-root) boots in Chromium, driven by
// playwright-core, behind the contract proxy (every answer and websocket frame checked against
// spec/openapi.yaml). The test builds EmptyImage ×2 → ImageBatch → CreateVideo → SaveVideo on the canvas with
// the frontend's own node classes (no model needed), presses the real Run button, and waits for SaveVideo's
// output. The frontend then shows the MP4 (H.264, served by /view with byte ranges) in a <video> element on the
// node; the test checks that element has loaded the file Kiln wrote (readyState ≥ 2, no media error, the
// frames' size), plays it and sees its clock advance. Debian's Chromium decodes H.264 (`canPlayType` answers
// "probably" for avc1). The same frames also go to two SaveWEBM nodes, VP9 and AV1: the frontend plays each
// WebM the same way, and its own WebM reader (`comfyAPI.ebml.getFromWebmFile`, what dropping a file on the
// canvas uses) finds the prompt and workflow in the file's tags.
//
// Usage: node tests/browser/video.test.mjs <path to kiln> <frontend static folder>
import assert from 'node:assert/strict';
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
  console.error('usage: video.test.mjs <path to kiln> <frontend static folder>');
  process.exit(2);
}

const dataDir = mkdtempSync(join(tmpdir(), 'kiln-browser-video-'));
process.on('exit', () => rmSync(dataDir, { recursive: true, force: true }));

const kiln = await spawnListening(kilnBinary, [
  '--port', '0', '--data-dir', dataDir, '--front-end-root', frontEndRoot, ...withoutTemplates,
]);
const proxy = await spawnListening(contractProxy, [kiln.url.replace('http://', '')]);
const { url } = proxy;
const browser = await launchChromium();
const problems = [];
let played;
const webms = [];
try {
  const context = await browser.newContext({ viewport: { width: 1600, height: 1000 } });
  // A returning user: no template browser over the canvas.
  await fetch(`${url}/api/settings/Comfy.TutorialCompleted`, { method: 'POST', body: 'true' });
  const page = await context.newPage();
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  recordUnexpectedAnswers(page, url, problems);
  const frames = [];
  recordFrames(page, frames);
  await page.goto(url + '/');
  // A returning user gets the frontend's default graph, loaded after the app starts; it is replaced only once
  // it is there (built earlier, ours would be overwritten by it).
  await page.waitForFunction(() => window.app?.graph?.nodes.length > 0 && window.LiteGraph, null, {
    timeout: 60_000,
  });
  await page.getByRole('button', { name: 'Run', exact: true }).waitFor({ timeout: 30_000 });
  const canPlay = await page.evaluate(() =>
    document.createElement('video').canPlayType('video/mp4; codecs="avc1.42E01E"'),
  );
  assert.notEqual(canPlay, '', 'this Chromium decodes H.264');
  for (const codecs of ['vp9', 'av01.0.08M.10']) {
    const answer = await page.evaluate(
      (type) => document.createElement('video').canPlayType(type),
      `video/webm; codecs="${codecs}"`,
    );
    assert.notEqual(answer, '', `this Chromium decodes ${codecs} in WebM`);
  }

  // The graph, built as the frontend builds nodes: two flat colours, four frames at 8 fps.
  const [saveId, vp9Id, av1Id] = await page.evaluate(() => {
    const graph = window.app.graph;
    graph.clear();
    const add = (type, pos, values) => {
      const node = window.LiteGraph.createNode(type);
      node.pos = pos;
      graph.add(node);
      for (const [name, value] of Object.entries(values)) {
        const widget = node.widgets.find((w) => w.name === name);
        widget.value = value;
        widget.callback?.(value, window.app.canvas, node);
      }
      return node;
    };
    const red = add('EmptyImage', [40, 60], { width: 64, height: 48, batch_size: 2, color: 0xd02020 });
    const blue = add('EmptyImage', [40, 360], { width: 64, height: 48, batch_size: 2, color: 0x2040d0 });
    const batch = add('ImageBatch', [380, 200], {});
    const create = add('CreateVideo', [640, 200], { fps: 8 });
    const save = add('SaveVideo', [940, 120], { filename_prefix: 'video/browser' });
    const vp9 = add('SaveWEBM', [640, 520], { filename_prefix: 'webm/vp9', codec: 'vp9', fps: 8 });
    const av1 = add('SaveWEBM', [1040, 520], { filename_prefix: 'webm/av1', codec: 'av1', fps: 8 });
    red.connect(0, batch, 0);
    blue.connect(0, batch, 1);
    batch.connect(0, create, 0);
    create.connect(0, save, 0);
    batch.connect(0, vp9, 0);
    batch.connect(0, av1, 0);
    graph.setDirtyCanvas(true, true);
    return [save, vp9, av1].map((node) => String(node.id));
  });

  const run = page.getByRole('button', { name: 'Run', exact: true });
  await run.waitFor({ timeout: 30_000 });
  const promptSent = page.waitForRequest(
    (request) => request.url().endsWith('/api/prompt') && request.method() === 'POST',
  );
  await run.click();
  const sent = (await promptSent).postDataJSON().prompt;
  assert.equal(sent[saveId]?.class_type, 'SaveVideo', `the prompt holds the SaveVideo node: ${JSON.stringify(sent)}`);
  const finished = await frameMatching(
    frames,
    (f) => f.type === 'execution_success' || f.type === 'execution_error',
    120_000,
  );
  assert.equal(finished?.type, 'execution_success', `the run succeeded: ${JSON.stringify(finished)}`);
  const executed = frames.find((f) => f.type === 'executed' && f.data.node === saveId);
  assert.ok(executed, 'SaveVideo reported its output');
  const [file] = executed.data.output.images;
  assert.deepEqual(executed.data.output.animated, [true]);
  assert.match(file.filename, /^browser_\d{5}_\.mp4$/);
  assert.equal(file.subfolder, 'video');

  // The frontend shows each file in a <video> element; it loads, has the frames' size and plays.
  const play = async (filename) => {
    const video = page.locator(`video[src*="${filename}"]`);
    await video.first().waitFor({ state: 'attached', timeout: 30_000 });
    const seen = await video.first().evaluate(async (element) => {
      element.muted = true;
      const ready = () =>
        new Promise((resolve, reject) => {
          if (element.readyState >= 2) return resolve();
          element.addEventListener('loadeddata', () => resolve(), { once: true });
          element.addEventListener('error', () => reject(new Error(`media error ${element.error?.code}`)), {
            once: true,
          });
          setTimeout(() => reject(new Error(`readyState ${element.readyState} after 20 s`)), 20_000);
        });
      await ready();
      const loaded = { readyState: element.readyState, width: element.videoWidth, height: element.videoHeight };
      element.currentTime = 0;
      await element.play();
      await new Promise((resolve) => setTimeout(resolve, 300));
      return {
        ...loaded,
        duration: element.duration,
        currentTime: element.currentTime,
        error: element.error?.code ?? null,
        src: element.currentSrc,
      };
    });
    assert.ok(seen.readyState >= 2, `${filename} loaded (readyState ${seen.readyState})`);
    assert.equal(seen.error, null, `no media error for ${filename}`);
    assert.deepEqual([seen.width, seen.height], [64, 48], `the frames of ${filename} are 64x48`);
    assert.ok(Math.abs(seen.duration - 0.5) < 0.01, `4 frames at 8 fps last 0.5 s, not ${seen.duration}`);
    assert.ok(seen.currentTime > 0, `the clock of ${filename} advanced after play()`);
    assert.match(seen.src, /\/api\/view\?/);
    return seen;
  };
  played = await play(file.filename);

  for (const [id, subfolder] of [[vp9Id, 'webm'], [av1Id, 'webm']]) {
    const saved = frames.find((f) => f.type === 'executed' && f.data.node === id);
    assert.ok(saved, `SaveWEBM ${id} reported its output`);
    assert.deepEqual(saved.data.output.animated, [true]);
    const [webm] = saved.data.output.images;
    assert.match(webm.filename, /^(vp9|av1)_\d{5}_\.webm$/);
    assert.equal(webm.subfolder, subfolder);
    const seen = await play(webm.filename);
    // The frontend's own reader, as when the file is dropped on the canvas.
    const found = await page.evaluate(async ({ filename, subfolder }) => {
      const query = new URLSearchParams({ filename, subfolder, type: 'output' });
      const bytes = await (await fetch(`/api/view?${query}`)).blob();
      const dropped = new File([bytes], filename, { type: 'video/webm' });
      const { workflow, prompt } = await window.comfyAPI.ebml.getFromWebmFile(dropped);
      return { nodes: workflow?.nodes?.length ?? null, classes: Object.values(prompt ?? {}).map((n) => n.class_type) };
    }, webm);
    assert.equal(found.nodes, 7, `the workflow read back from ${webm.filename}: ${JSON.stringify(found)}`);
    assert.ok(found.classes.includes('SaveWEBM'), `the prompt read back from ${webm.filename}`);
    webms.push(`${webm.filename} (${seen.width}x${seen.height}, ${seen.duration} s)`);
  }

  mkdirSync(screenshots, { recursive: true });
  await page.screenshot({ path: join(screenshots, 'video-played.png') });
  assert.deepEqual(problems, [], 'no page errors and no unexpected 4xx/5xx');
} finally {
  await shutDown({ browser, proxy, kiln });
}
console.log(
  `ok: the frontend played Kiln's MP4 (${played.width}x${played.height}, ${played.duration} s, ` +
    `clock at ${played.currentTime.toFixed(3)} s after play) and WebMs ${webms.join(', ')}, and read the ` +
    'WebMs\' workflows back; screenshot in target/browser/video-played.png',
);
