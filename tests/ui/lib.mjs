// Shared pieces of the browser tests: chromium through playwright-core, the line protocol with pytest,
// screenshots, page-error capture and the axe-core accessibility check.
import { createRequire } from 'node:module';
import path from 'node:path';
import fs from 'node:fs';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const uiDir = process.env.HF_UI_DIR || path.resolve(here, '..', '..', 'api', 'ui');
const require = createRequire(path.join(uiDir, 'package.json'));
export const { chromium } = require('playwright-core');

export const API = (process.env.HF_API_URL || 'http://127.0.0.1:8000').replace(/\/$/, '');
export const KEY = process.env.HF_API_KEY;
export const OUT = process.env.HF_ARTIFACTS || path.resolve(here, '..', '..', 'test-artifacts', 'ui');
export const EXE = process.env.HF_CHROMIUM || '/usr/bin/chromium';
// Tiles point at a closed local port: exercises "tiles failing must not break anything" offline,
// and a test run never sends traffic to a public tile server.
export const TILE_URL = process.env.HF_TILE_URL ?? 'http://127.0.0.1:9/tiles/{z}/{x}/{y}.png';
fs.mkdirSync(OUT, { recursive: true });

export const emit = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');

const rl = readline.createInterface({ input: process.stdin });
const queue = [];
let waiter = null;
rl.on('line', (line) => {
  line = line.trim();
  if (!line) return;
  let cmd;
  try { cmd = JSON.parse(line); } catch { cmd = { cmd: line }; }
  if (waiter) { const w = waiter; waiter = null; w(cmd); } else queue.push(cmd);
});
rl.on('close', () => { if (waiter) { const w = waiter; waiter = null; w({ cmd: 'quit' }); } });
export const nextCommand = (timeoutMs = 180000) => new Promise((resolve, reject) => {
  if (queue.length) return resolve(queue.shift());
  const t = setTimeout(() => { waiter = null; reject(new Error('no command from pytest within ' + timeoutMs + ' ms')); }, timeoutMs);
  waiter = (c) => { clearTimeout(t); resolve(c); };
});

export const pageErrors = [];

export async function shot(p, name) {
  const file = path.join(OUT, name + '.png');
  await p.screenshot({ path: file });
  emit({ log: 'screenshot', file });
  return file;
}

export function watch(p, label) {
  p.on('pageerror', (err) => { pageErrors.push(String(err)); emit({ log: 'pageerror', page: label, text: String(err.stack || err) }); });
  p.on('console', (msg) => {
    if (msg.type() === 'error' && !/Failed to load resource|ERR_CONNECTION_REFUSED|tiles\//.test(msg.text())) {
      emit({ log: 'console.error', page: label, text: msg.text() });
    }
  });
}

export function launch() {
  return chromium.launch({
    executablePath: EXE, headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
      '--disable-sync', '--no-first-run', '--autoplay-policy=no-user-gesture-required'],
  });
}

export async function withOfflineTiles(context) {
  await context.addInitScript((tiles) => {
    if (localStorage.getItem('herdfence.tileUrl') === null) localStorage.setItem('herdfence.tileUrl', tiles);
  }, TILE_URL);
}

// axe-core is served by the API from node_modules (the page's CSP allows only its own scripts).
// Returns the serious and critical violations: [{id, impact, help, targets}].
export async function axe(p) {
  if (!(await p.evaluate(() => !!window.axe))) await p.addScriptTag({ url: API + '/vendor/axe/axe.min.js' });
  const res = await p.evaluate(() => window.axe.run(document, { resultTypes: ['violations'] }));
  return res.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => ({ id: v.id, impact: v.impact, help: v.help, targets: v.nodes.slice(0, 5).map((n) => n.target.join(' ')) }));
}

export function run(main, getPage) {
  main().then(async (browser) => {
    await browser?.close();
    process.exit(0);
  }, async (err) => {
    emit({ error: String((err && err.stack) || err) });
    try { const p = getPage(); if (p) await shot(p, 'failure'); } catch { /* ignore */ }
    process.exit(1);
  });
}
