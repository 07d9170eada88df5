// Records engine/tests/fixtures/webm/chromium_mediarecorder.webm: two seconds of a canvas (a colour that
// changes every frame and a moving white square) and a 440 Hz oscillator, recorded by Chromium's own
// MediaRecorder as `video/webm;codecs=vp9,opus`. Such a file is what a user records in a browser: VP9 tagged
// BT.709 full range, Opus, clusters of unknown size, no duration and no default frame duration.
// scripts/reference/webm.py then writes what FFmpeg decodes from it.
//
// Usage (Debian's Chromium and the pinned playwright-core of package.json): node scripts/reference/mediarecorder.mjs
import { chromium } from 'playwright-core';
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

const out = join(dirname(fileURLToPath(import.meta.url)), '../../engine/tests/fixtures/webm/chromium_mediarecorder.webm');
const browser = await chromium.launch({ executablePath: 'chromium', args: ['--no-sandbox', '--autoplay-policy=no-user-gesture-required'] });
const page = await browser.newPage();
await page.setContent('<canvas id=c width=96 height=64></canvas>');
const b64 = await page.evaluate(async () => {
  const c = document.getElementById('c'); const g = c.getContext('2d');
  const ac = new AudioContext(); const osc = ac.createOscillator(); osc.frequency.value = 440;
  const dest = ac.createMediaStreamDestination(); osc.connect(dest); osc.start();
  const stream = c.captureStream(25); stream.addTrack(dest.stream.getAudioTracks()[0]);
  const mime = 'video/webm;codecs=vp9,opus';
  const rec = new MediaRecorder(stream, { mimeType: mime });
  const chunks = []; rec.ondataavailable = (e) => chunks.push(e.data);
  rec.start(200);
  let i = 0; const t0 = performance.now();
  await new Promise((resolve) => { const draw = () => { g.fillStyle = `rgb(${(i*20)%256},80,160)`; g.fillRect(0,0,96,64); g.fillStyle='white'; g.fillRect((i*4)%96, 10, 8, 8); i++; if (performance.now() - t0 < 2000) requestAnimationFrame(draw); else resolve(); }; draw(); });
  rec.stop(); await new Promise((r) => (rec.onstop = r));
  const blob = new Blob(chunks, { type: mime }); const buf = new Uint8Array(await blob.arrayBuffer());
  let s = ''; for (const x of buf) s += String.fromCharCode(x); return btoa(s);
});
writeFileSync(out, Buffer.from(b64, 'base64'));
await browser.close();
console.log(`wrote ${out}`);
