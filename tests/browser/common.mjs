// What the browser tests share: where Chromium, the contract proxy and the screenshots are, the 4xx answers a
// fresh ComfyUI install also gives while the frontend boots (and recording the others), recording and awaiting
// websocket frames, starting a process that logs the address it listens on, serving a folder of wheels on
// loopback, stopping the contract proxy for its report, launching Chromium and shutting it all down.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));

/** Screenshots for humans go here. */
export const screenshots = join(here, '..', '..', 'target', 'browser');

/** The contract proxy binary (target/debug/kiln-contract-proxy, or $KILN_CONTRACT_PROXY). */
export const contractProxy =
  process.env.KILN_CONTRACT_PROXY ?? join(here, '..', '..', 'target', 'debug', 'kiln-contract-proxy');

/**
 * Kiln's flags for a test that is not about the workflow templates: their download goes to a loopback port
 * nothing listens on, so it fails at once, as offline (one log line; `/templates/` answers 404 as on a ComfyUI
 * without the templates package), and no test reaches the internet. templates.test.mjs and tests/templates
 * serve the real wheels.
 */
export const withoutTemplates = ['--templates-wheels-url', 'http://127.0.0.1:1/offline'];

// What a fresh ComfyUI install also answers with 4xx while the frontend boots: no user.css, no saved workflows or
// subgraphs yet, no templates package. Any other 4xx, and every 5xx, fails a test.
export const expectedMisses = [
  /\/user\.css$/,
  /\/api\/userdata\/user\.css$/,
  /\/api\/userdata\/comfy\.templates\.json$/,
  /\/api\/userdata\?dir=(workflows|subgraphs)&/,
  /\/templates\//,
];

/**
 * Records into `problems` every 5xx, and every 4xx that is not one of `misses` (by default `expectedMisses`),
 * `page` gets from `url`.
 */
export function recordUnexpectedAnswers(page, url, problems, misses = expectedMisses) {
  page.on('response', (response) => {
    const address = response.url();
    if (!address.startsWith(url) || response.status() < 400) return;
    if (response.status() >= 500 || !misses.some((miss) => miss.test(address))) {
      problems.push(`${response.request().method()} ${address} answered ${response.status()}`);
    }
  });
}

/** Every websocket text frame the page receives, as parsed JSON, pushed into `frames`. */
export function recordFrames(page, frames) {
  page.on('websocket', (socket) => {
    socket.on('framereceived', ({ payload }) => {
      if (typeof payload === 'string') frames.push(JSON.parse(payload));
    });
  });
}

/** Resolves to the first of `frames` (still being recorded) that satisfies `accept`, within `timeout` ms. */
export async function frameMatching(frames, accept, timeout) {
  const end = Date.now() + timeout;
  for (;;) {
    const found = frames.find(accept);
    if (found) return found;
    if (Date.now() > end) throw new Error(`no such websocket frame within ${timeout} ms`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

/**
 * Spawns `command args`; resolves to the process, the `http://host:port` it logs as listening on, its stderr
 * lines, and `log`: every line it has logged, kept growing (a listener added later may miss lines that came with
 * the one that said it listens).
 */
export async function spawnListening(command, args) {
  const child = spawn(command, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  const lines = createInterface({ input: child.stderr });
  const log = [];
  const url = await new Promise((resolve, reject) => {
    child.on('exit', (code) =>
      reject(new Error(`${command} exited with ${code} before listening:\n${log.join('\n')}`)),
    );
    lines.on('line', (line) => {
      log.push(line);
      const found = line.match(/listening on (http:\/\/\S+)/);
      if (found) resolve(found[1]);
    });
  });
  return { child, url, lines, log };
}

/**
 * Serves the files of `dir` at /<name> on a free loopback port (a stand-in for PyPI: a mirror folder of wheels);
 * other names answer 404. Resolves to `{ server, served: { requests }, url }`.
 */
export async function serveFolder(dir) {
  const served = { requests: 0 };
  const files = new Set(readdirSync(dir));
  const server = createServer((request, response) => {
    served.requests += 1;
    const name = decodeURIComponent(request.url.slice(1));
    if (!files.has(name)) return response.writeHead(404).end();
    const bytes = readFileSync(join(dir, name));
    response.writeHead(200, { 'content-type': 'application/zip', 'content-length': bytes.length }).end(bytes);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, served, url: `http://127.0.0.1:${server.address().port}` };
}

/**
 * Resolves to Kiln's `system` facts (`/api/system_stats`) once it reports the workflow templates installed;
 * fails after `timeout` ms.
 */
export async function templatesInstalled(url, timeout) {
  const end = Date.now() + timeout;
  for (;;) {
    const stats = await (await fetch(`${url}/api/system_stats`)).json();
    if (stats.system.installed_templates_version !== null) return stats.system;
    if (Date.now() > end) {
      throw new Error(`the workflow templates were not installed within ${timeout} ms: ${JSON.stringify(stats.system)}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
}

/** Stops the proxy; resolves to its exit code and its report (answers checked, violations). */
export async function stopProxy({ child, lines }) {
  const report = [];
  lines.on('line', (line) => report.push(line));
  const code = await new Promise((resolve) => {
    child.on('exit', resolve);
    child.kill('SIGTERM');
  });
  return { code, report: report.join('\n') };
}

/**
 * Closes the browser, stops the contract proxy and kills kiln; prints the proxy's count and fails when it saw an
 * answer or frame the spec does not describe.
 */
export async function shutDown({ browser, proxy, kiln }) {
  await browser.close();
  const contract = await stopProxy(proxy);
  kiln.child.kill('SIGKILL');
  console.log(contract.report.split('\n')[0]);
  assert.equal(contract.code, 0, `kiln sent answers the spec does not describe:\n${contract.report}`);
}

/** Debian's Chromium ($KILN_CHROMIUM or /usr/bin/chromium), headless, with nothing reaching the network. */
export function launchChromium() {
  return chromium.launch({
    executablePath: process.env.KILN_CHROMIUM ?? '/usr/bin/chromium',
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
}
