// The template suite: ComfyUI's official workflow templates as the measure of how much of ComfyUI Kiln can
// replace (issue #20).
//
// Kiln starts on a fresh data directory and installs the pinned `comfyui-workflow-templates` packages as a user's
// first start does (from a loopback server over the wheels `pip download` fetched, through
// --templates-wheels-url; the suite never reaches the internet). Behind the contract proxy, for every local
// template of the package (one whose index entry is not `openSource: false`; the partner-API templates, which
// need a comfy.org account, are counted apart):
//
// 1. the real frontend that Kiln serves, in Chromium, opens the template from /templates/ and converts it with
//    its own `graphToPrompt` (convert.mjs);
// 2. every model file the template names is written by `kiln model synth --size tiny --family F --name FILE`
//    under that exact name, for the families Kiln runs (families.mjs), and every image a LoadImage names as a
//    small PNG, every video a LoadVideo names as a short MP4;
// 3. the prompt is shrunk in the one documented way (shrink.mjs) and queued; the suite waits for its history.
//
// Each template ends as one of: `ran` (every output node produced its output), `missing nodes`, `missing
// family`, `unsupported file format`, `conversion failed` or `failed`, with the reason. The report goes to
// target/templates/report.{md,json} (report.mjs). tests/templates/expected-ran.txt lists the templates that run:
// the suite fails when one of them no longer runs, and when one runs that is not listed (add it: the list and
// the README's counts are the record). KILN_TEMPLATES_UPDATE=1 rewrites the list (never under CI=true).
//
// Usage: node tests/templates/run.mjs <path to kiln> <frontend static folder> <folder of the template wheels>
//        [template names: only these]
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import {
  contractProxy,
  launchChromium,
  serveFolder,
  shutDown,
  spawnListening,
  templatesInstalled,
} from '../browser/common.mjs';
import { convertInPage } from './convert.mjs';
import { familyOf, kilnFile, mainModel, modelFiles, templateFamily } from './families.mjs';
import * as report from './report.mjs';
import { shrink } from './shrink.mjs';

const [kilnBinary, frontEndRoot, wheelsDir, ...only] = process.argv.slice(2);
if (!kilnBinary || !frontEndRoot || !wheelsDir) {
  console.error('usage: run.mjs <path to kiln> <frontend static folder> <folder of the template wheels> [names]');
  process.exit(2);
}
const here = dirname(fileURLToPath(import.meta.url));
const expectedFile = join(here, 'expected-ran.txt');
const reportDir = join(here, '..', '..', 'target', 'templates');
const runTimeout = Number(process.env.KILN_TEMPLATES_RUN_TIMEOUT_S ?? 300) * 1000;
const started = Date.now();

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** GETs `path` from Kiln (through the proxy) as JSON. */
async function getJson(url, path) {
  const response = await fetch(url + path);
  assert.equal(response.status, 200, `GET ${path}`);
  return response.json();
}

/** One line of what the frontend's conversion says about a template: the outcome before any run. */
function classify(converted) {
  const unknownTypes = (nodes) => [...new Set(nodes.filter((n) => !n.known).map((n) => n.type))].sort();
  if (converted.error) {
    // A frontend that lacks a node type may fail on that node's links: name the types it lacks.
    const missingNodes = converted.unknown ?? unknownTypes(converted.nodes ?? []);
    if (missingNodes.length > 0) {
      const detail = `${missingNodes.join(', ')} (the frontend's conversion failed without them: ${converted.error})`;
      return { outcome: 'missing nodes', detail, missingNodes, files: [] };
    }
    return { outcome: 'conversion failed', detail: converted.error, missingNodes: [], files: [] };
  }
  const missingNodes = unknownTypes(converted.nodes);
  const files = modelFiles(converted.nodes);
  const result = { missingNodes, files };
  if (Object.keys(converted.prompt).length === 0) {
    return { ...result, outcome: 'conversion failed', detail: 'the frontend sent no node' };
  }
  const unknown = new Map();
  const unsupported = [];
  for (const file of files) {
    const known = kilnFile(file, mainModel(files));
    if (!known) {
      const family = familyOf(file.name);
      unknown.set(family, [...(unknown.get(family) ?? []), file.name]);
    } else if (known.unsupported) {
      unsupported.push(`${file.name} (${known.unsupported})`);
    }
  }
  const families = [...unknown.entries()].map(([family, names]) => `${family} (${names.join(', ')})`).join('; ');
  if (missingNodes.length > 0) {
    // Name the families it lacks too, so the line says everything the template needs.
    const detail = missingNodes.join(', ') + (families ? `; also missing family: ${families}` : '');
    return { ...result, outcome: 'missing nodes', detail };
  }
  if (unknown.size > 0) return { ...result, outcome: 'missing family', detail: families };
  if (unsupported.length > 0) return { ...result, outcome: 'unsupported file format', detail: unsupported.join(', ') };
  return { ...result, outcome: 'to run' };
}

/**
 * What a template needs written into Kiln's data folder before it runs, as a list a later replay can repeat
 * (bench/templates-replay.py does, on the GPU machine): `{ synth: [kiln model synth arguments after --size tiny
 * --models-dir], key }` for each model file, `{ copy: repository-relative source, to: data-relative path }` for
 * each image and video a LoadImage, LoadImageMask, Painter or LoadVideo names, `{ tone: { rate, seconds }, to }` for each
 * audio file a LoadAudio names. Each file once, in that order.
 */
function preparations(result, prompt) {
  const steps = [];
  const main = mainModel(result.files);
  for (const file of result.files) {
    const { family, dtype, under } = kilnFile(file, main);
    const name = under ? `${under}/${file.name}` : file.name;
    const key = `${file.folder}/${name}`;
    steps.push({ synth: ['--family', family, '--name', key, '--dtype', dtype], key });
    // A file written apart: the prompt names it there.
    if (under) {
      for (const node of Object.values(prompt)) {
        for (const [input, value] of Object.entries(node.inputs)) {
          if (value === file.name) node.inputs[input] = name;
        }
      }
    }
  }
  // `name [output]` names a file of another folder, as the frontend annotates it.
  const dataPath = (value) => {
    const [, name, folder] = value.match(/^(.*?)(?: \[(input|output|temp)\])?$/);
    return `${folder ?? 'input'}/${name}`;
  };
  const inputs = [
    // Every image: the browser tests' small PNG.
    [['LoadImage', 'LoadImageMask'], 'image', { copy: 'tests/browser/kiln-input.png' }],
    // A Painter's painting (a temporary file the frontend uploaded as the user painted): the same PNG.
    [['Painter'], 'mask', { copy: 'tests/browser/kiln-input.png' }],
    // Every video: a short x264 High clip with AAC audio (the engine's decoder fixture).
    [['LoadVideo'], 'file', { copy: 'engine/tests/fixtures/video/x264_high_aac.mp4' }],
    // Every audio file: a second of a 440 Hz tone at 24 kHz (so an audio encoder resamples it).
    [['LoadAudio'], 'audio', { tone: { rate: 24000, seconds: 1 } }],
  ];
  for (const [types, input, source] of inputs) {
    for (const node of Object.values(prompt)) {
      const value = node.inputs[input];
      if (!types.includes(node.class_type) || typeof value !== 'string' || value === '') continue;
      const to = dataPath(value);
      if (!steps.some((step) => step.to === to)) steps.push({ ...source, to });
    }
  }
  return steps;
}

/**
 * Carries out `steps` (see `preparations`) in `dataDir`, skipping what `written` already holds; resolves to null,
 * or to why a file could not be written.
 */
function prepare(steps, dataDir, written) {
  for (const step of steps) {
    const key = step.key ?? step.to;
    if (written.has(key)) continue;
    if (step.synth) {
      try {
        execFileSync(kilnBinary, ['model', 'synth', '--size', 'tiny', '--models-dir', join(dataDir, 'models'), ...step.synth], {
          stdio: ['ignore', 'ignore', 'pipe'],
        });
      } catch (error) {
        return `kiln model synth ${step.synth.join(' ')}: ${error.stderr?.toString().trim() || error.message}`;
      }
    } else {
      const path = join(dataDir, step.to);
      mkdirSync(dirname(path), { recursive: true });
      if (step.copy) copyFileSync(join(here, '..', '..', step.copy), path);
      else writeFileSync(path, toneWav(step.tone.rate, step.tone.seconds));
    }
    written.add(key);
  }
  return null;
}

/** A mono 16-bit PCM WAV file of `seconds` of a 440 Hz tone at `rate` Hz. */
function toneWav(rate, seconds) {
  const samples = rate * seconds;
  const wav = Buffer.alloc(44 + 2 * samples);
  wav.write('RIFF', 0);
  wav.writeUInt32LE(36 + 2 * samples, 4);
  wav.write('WAVEfmt ', 8);
  wav.writeUInt32LE(16, 16);
  wav.writeUInt16LE(1, 20); // PCM
  wav.writeUInt16LE(1, 22); // mono
  wav.writeUInt32LE(rate, 24);
  wav.writeUInt32LE(2 * rate, 28);
  wav.writeUInt16LE(2, 32);
  wav.writeUInt16LE(16, 34);
  wav.write('data', 36);
  wav.writeUInt32LE(2 * samples, 40);
  for (let i = 0; i < samples; i++) {
    wav.writeInt16LE(Math.round(8000 * Math.sin((2 * Math.PI * 440 * i) / rate)), 44 + 2 * i);
  }
  return wav;
}

/** Queues `prompt` and waits for its history entry; resolves to the outcome and its reason. */
async function run(url, prompt, objectInfo) {
  const response = await fetch(`${url}/api/prompt`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, client_id: 'kiln-template-suite' }),
  });
  const text = await response.text();
  let answer;
  try {
    answer = JSON.parse(text);
  } catch {
    return { outcome: 'failed', detail: `POST /api/prompt answered ${response.status}: ${text.slice(0, 200)}` };
  }
  if (response.status !== 200) {
    const nodes = Object.entries(answer.node_errors ?? {}).map(
      ([id, e]) => `${id} (${e.class_type}): ${e.errors.map((x) => `${x.message}: ${x.details}`).join('; ')}`,
    );
    return { outcome: 'failed', detail: `prompt refused: ${answer.error?.message}${nodes.length ? ` (${nodes.join('; ')})` : ''}` };
  }
  const end = Date.now() + runTimeout;
  let entry;
  while (!entry) {
    if (Date.now() > end) {
      // Stop it, running or still queued, so the templates after it get the server.
      const post = (path, body) =>
        fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      await post('/api/interrupt', { prompt_id: answer.prompt_id });
      await post('/api/queue', { delete: [answer.prompt_id] });
      return { outcome: 'failed', detail: `no result within ${runTimeout / 1000} s (interrupted)` };
    }
    await sleep(250);
    entry = (await getJson(url, `/api/history/${answer.prompt_id}`))[answer.prompt_id];
  }
  if (entry.status.status_str !== 'success') {
    const error = entry.status.messages.find(([kind]) => kind === 'execution_error')?.[1];
    const where = error ? `${error.node_type} (${error.node_id}): ` : '';
    return { outcome: 'failed', detail: `${where}${error?.exception_message ?? entry.status.status_str}` };
  }
  const silent = Object.entries(prompt)
    .filter(([, node]) => objectInfo[node.class_type]?.output_node)
    .filter(([id]) => !entry.outputs[id])
    .map(([id, node]) => `${id} (${node.class_type})`);
  if (silent.length > 0) return { outcome: 'failed', detail: `no output from ${silent.join(', ')}` };
  return { outcome: 'ran' };
}

/** The templates the expectations file lists. */
function expectedRan() {
  return readFileSync(expectedFile, 'utf8')
    .split('\n')
    .map((line) => line.replace(/#.*/, '').trim())
    .filter(Boolean);
}

const dataDir = mkdtempSync(join(tmpdir(), 'kiln-templates-'));
process.on('exit', () => rmSync(dataDir, { recursive: true, force: true }));
const mirror = await serveFolder(wheelsDir);
const kiln = await spawnListening(kilnBinary, [
  '--port', '0', '--data-dir', dataDir, '--front-end-root', frontEndRoot, '--templates-wheels-url', mirror.url,
]);
const proxy = await spawnListening(contractProxy, [kiln.url.replace('http://', '')]);
const { url } = proxy;
const browser = await launchChromium();
const results = [];
// Each template that ran: its name, preparations and the prompt as it was queued (target/templates/replay.json).
const replay = [];
const problems = [];
let version;
let partnerApi;
try {
  version = (await templatesInstalled(url, 600_000)).installed_templates_version;
  mirror.server.close();
  const index = (await getJson(url, '/templates/index.json')).flatMap((category) => category.templates);
  const local = index.filter((t) => t.openSource !== false);
  partnerApi = index.length - local.length;
  const chosen = only.length ? local.filter((t) => only.includes(t.name)) : local;
  assert.equal(chosen.length, only.length || local.length, `unknown template among ${only.join(', ')}`);
  const objectInfo = await getJson(url, '/api/object_info');

  // The frontend as a returning user: no tutorial, no warning dialogs over the canvas.
  await fetch(`${url}/api/settings`, {
    method: 'POST',
    body: JSON.stringify({
      'Comfy.TutorialCompleted': true,
      'Comfy.Workflow.ShowMissingNodesWarning': false,
      'Comfy.Workflow.ShowMissingMediaWarning': false,
    }),
  });
  const page = await browser.newPage();
  const pageErrors = [];
  page.on('pageerror', (error) => pageErrors.push(error.message));
  page.on('response', (response) => {
    if (response.url().startsWith(url) && response.status() >= 500) {
      problems.push(`${response.request().method()} ${response.url()} answered ${response.status()}`);
    }
  });
  await page.goto(`${url}/`);
  await page.waitForFunction(() => window.app?.graph !== undefined, null, { timeout: 60_000 });

  const written = new Set();
  for (const template of chosen) {
    const begun = Date.now();
    pageErrors.length = 0;
    const converted = await page.evaluate(convertInPage, template.name);
    // Errors the loaded graph throws after the conversion returns (its nodes' connection handlers run on later
    // frames) belong to this template, not to the next one: let them land before reading them.
    await page.evaluate(
      () => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(resolve)))),
    );
    if (pageErrors.length > 0 && !converted.error) converted.error = `page error: ${pageErrors.join('; ')}`;
    const result = { name: template.name, title: template.title, ...classify(converted), shrunk: [] };
    result.family = templateFamily(result.files);
    if (result.outcome === 'to run') {
      const prompt = converted.prompt;
      result.shrunk = shrink(prompt, objectInfo);
      const steps = preparations(result, prompt);
      const unwritten = prepare(steps, dataDir, written);
      Object.assign(result, unwritten ? { outcome: 'failed', detail: unwritten } : await run(url, prompt, objectInfo));
      if (result.outcome === 'ran') replay.push({ name: template.name, steps, prompt });
    }
    result.seconds = Number(((Date.now() - begun) / 1000).toFixed(1));
    results.push(result);
    if (!['missing nodes', 'missing family', 'unsupported file format'].includes(result.outcome)) {
      console.log(`${template.name}: ${result.outcome}${result.detail ? `: ${result.detail}` : ''} (${result.seconds} s)`);
    }
  }
} finally {
  await shutDown({ browser, proxy, kiln });
}

const packages = `comfyui-workflow-templates ${version}`;
const seconds = (Date.now() - started) / 1000;
const document = { packages, results, partnerApi, seconds };
mkdirSync(reportDir, { recursive: true });
writeFileSync(join(reportDir, 'report.md'), report.markdown(document));
writeFileSync(join(reportDir, 'report.json'), report.json(document));
writeFileSync(join(reportDir, 'replay.json'), `${JSON.stringify({ packages, templates: replay })}\n`);

const ran = results.filter((r) => r.outcome === 'ran').map((r) => r.name);
const expected = expectedRan().filter((name) => !only.length || only.includes(name));
const stopped = expected.filter((name) => !ran.includes(name));
const unlisted = ran.filter((name) => !expected.includes(name));
if (process.env.KILN_TEMPLATES_UPDATE === '1' && process.env.CI !== 'true' && !only.length) {
  const header = readFileSync(expectedFile, 'utf8').split('\n').filter((line) => line.startsWith('#'));
  writeFileSync(expectedFile, `${[...header, ...[...ran].sort()].join('\n')}\n`);
  console.log(`rewrote ${basename(expectedFile)}: ${ran.length} templates`);
} else {
  assert.deepEqual(stopped, [], `templates that ran before and no longer run:\n${results
    .filter((r) => stopped.includes(r.name))
    .map((r) => `  ${r.name}: ${r.outcome}: ${r.detail}`)
    .join('\n')}`);
  assert.deepEqual(unlisted, [], `templates that now run: add them to tests/templates/${basename(expectedFile)}`);
}
assert.deepEqual(problems, [], 'no 5xx answers');
console.log(`ok: ${report.headline(report.counts(results, partnerApi))}; report in target/templates/report.md (${seconds.toFixed(0)} s)`);
