// Real-browser test of the herdfence web UI, driven by tests/stack/test_ui.py.
//
// Protocol: this script prints one JSON object per line on stdout ({"step": ...} when a step is done,
// {"log": ...} for browser diagnostics, {"error": ...} on failure) and reads one JSON command per line
// on stdin from the pytest side, which talks to the API in between (posts GPS reports, checks fences).
//
// env: HF_API_URL (e.g. http://127.0.0.1:8000), HF_API_KEY (farm key), HF_ARTIFACTS (screenshot dir),
//      HF_CHROMIUM (default /usr/bin/chromium), HF_UI_DIR (dir holding node_modules, default api/ui).
import { API, KEY, TILE_URL, emit, nextCommand, shot as shotOf, watch, launch, withOfflineTiles, axe, pageErrors } from './lib.mjs';

let browser, page;
const shot = (name, p = page) => shotOf(p, name);

async function markerBox(deviceId) {
  const dot = page.locator(`.herd-marker .dot[data-device-id="${deviceId}"]`);
  return dot.boundingBox();
}

async function signIn() {
  await page.goto(API + '/', { waitUntil: 'domcontentloaded' });
  await page.locator('#login-key').waitFor({ state: 'visible', timeout: 15000 });
  const axeLogin = await axe(page);
  await shot('00-sign-in');

  // a wrong key must be refused with a visible message
  await page.fill('#login-key', 'not-a-real-key');
  await page.click('#login-btn');
  await page.waitForFunction(() => document.querySelector('#login-error').textContent.trim().length > 0, null, { timeout: 15000 });
  const wrongMsg = await page.textContent('#login-error');
  await shot('00b-wrong-key');
  if (!(await page.locator('#app').isHidden())) throw new Error('app shown for a wrong key');

  await page.fill('#login-key', KEY);
  await page.click('#login-btn');
  await page.locator('#app').waitFor({ state: 'visible', timeout: 15000 });
  await page.locator('#draw-fence-btn').waitFor({ state: 'visible', timeout: 15000 });
  await page.waitForFunction(() => document.querySelector('#conn-status').dataset.state !== 'connecting', null, { timeout: 15000 });
  // the tile server is unreachable: the map must say so and keep working on its own background
  const tileNote = await page.locator('#tile-note').waitFor({ state: 'attached', timeout: 10000 }).then(() => true, () => false);
  const stored = await page.evaluate(() => localStorage.getItem('herdfence.apiKey'));
  if (stored !== KEY) throw new Error('API key was not stored in localStorage');
  await page.waitForTimeout(500);
  return { wrongMsg: wrongMsg.trim(), tileNote, axeLogin, axeApp: await axe(page) };
}

async function drawFence(name) {
  // "Draw a fence": the drawing bar opens above the map, the mouse clicks the corners
  await page.click('#draw-fence-btn');
  await page.locator('#draw-bar').waitFor({ state: 'visible', timeout: 5000 });
  await page.waitForTimeout(300); // the map shrinks under the bar
  const box = await page.locator('#map').boundingBox();
  const cx = box.x + box.width / 2, cy = box.y + box.height / 2;
  const w = Math.min(box.width * 0.22, 170), h = Math.min(box.height * 0.22, 120);
  const pts = [[cx - w, cy - h], [cx + w, cy - h * 1.1], [cx + w * 1.05, cy + h], [cx - w * 0.95, cy + h * 1.05]];
  for (const [x, y] of pts) {
    await page.mouse.move(x, y, { steps: 4 });
    await page.mouse.click(x, y);
    await page.waitForTimeout(150);
  }
  await page.mouse.move(pts[0][0], pts[0][1], { steps: 4 });
  await page.mouse.click(pts[0][0], pts[0][1]); // close the ring on the first vertex
  const dialog = page.locator('#fence-dialog');
  await dialog.waitFor({ state: 'visible', timeout: 5000 });
  await page.fill('#fence-name', name);
  await shot('02-name-fence');
  await page.click('#fence-save');
  await dialog.waitFor({ state: 'hidden', timeout: 15000 });
  const item = page.locator('#fence-list [data-fence-id]', { hasText: name });
  await item.waitFor({ state: 'visible', timeout: 15000 });
  const fenceId = await item.getAttribute('data-fence-id');
  const errorShown = await page.locator('#error-banner').isVisible();
  if (errorShown) throw new Error('error banner after saving: ' + (await page.textContent('#error-text')));
  await shot('03-fence-saved');
  return { fenceId, vertices: pts.length };
}

async function selectTab(name) {
  await page.click('#tab-' + name);
  await page.locator('#panel-' + name).waitFor({ state: 'visible' });
}

async function waitDevice(cmd) {
  const id = cmd.device_id, st = cmd.state, timeout = cmd.timeout_ms || 40000;
  const t0 = Date.now();
  await page.locator(`.herd-marker .dot[data-device-id="${id}"][data-state="${st}"]`).waitFor({ state: 'attached', timeout });
  await page.locator(`#device-list [data-device-id="${id}"][data-state="${st}"]`).waitFor({ state: 'attached', timeout: 10000 });
  let alert = null;
  if (cmd.alert) {
    const left = Math.max(5000, timeout - (Date.now() - t0));
    const sel = `#alerts li[data-type="${cmd.alert}"][data-device-id="${id}"]`;
    await page.locator(sel).first().waitFor({ state: 'attached', timeout: left });
    alert = (await page.locator(sel).first().textContent()).trim();
  }
  return { waited_ms: Date.now() - t0, alert };
}

async function run() {
  if (!KEY) throw new Error('HF_API_KEY is not set');
  browser = await launch();
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, locale: 'en-GB' });
  await withOfflineTiles(context);
  page = await context.newPage();
  watch(page, 'desktop');

  const { wrongMsg, tileNote, axeLogin, axeApp } = await signIn();
  await shot('01-signed-in');
  emit({ step: 'signed_in', wrong_key_message: wrongMsg, tile_note: tileNote, axe_login: axeLogin, axe_app: axeApp });

  let cmd = await nextCommand();
  const drawn = await drawFence(cmd.name || 'North paddock');
  emit({ step: 'fence_drawn', fence_id: drawn.fenceId, vertices: drawn.vertices });

  let lastBox = null;
  for (;;) {
    cmd = await nextCommand();
    if (cmd.cmd === 'quit') break;
    if (cmd.cmd === 'wait_device') {
      if (cmd.tab) await selectTab(cmd.tab);
      const r = await waitDevice(cmd);
      const box = await markerBox(cmd.device_id);
      const moved = lastBox && box ? Math.hypot(box.x - lastBox.x, box.y - lastBox.y) : null;
      const extra = {};
      if (cmd.alert === 'exit') {
        extra.flash = await page.evaluate(() => document.querySelector('#flash').classList.contains('active'));
        extra.last_exit = await page.evaluate(() => document.body.getAttribute('data-last-exit'));
        extra.toast = (await page.textContent('#toast')).trim();
        extra.sse_events = await page.evaluate(() => window.herdfence.state.sseEvents);
        extra.axe = await axe(page); // the desktop app with a fence, an animal and alerts
      }
      await shot(cmd.screenshot || ('device-' + cmd.state));
      lastBox = box || lastBox;
      emit({ step: 'device_' + cmd.state, ...r, marker_box: box, moved_px: moved, ...extra });
    } else if (cmd.cmd === 'rename') {
      await selectTab('fences');
      const li = page.locator(`#fence-list [data-fence-id="${cmd.fence_id}"]`);
      await li.locator('[data-action="rename"]').click();
      await li.locator('input[name="name"]').fill(cmd.name);
      await li.locator('[data-action="rename-save"]').click();
      await page.locator(`#fence-list [data-fence-id="${cmd.fence_id}"] .fence-name`, { hasText: cmd.name }).waitFor({ timeout: 15000 });
      emit({ step: 'renamed' });
    } else if (cmd.cmd === 'edit_shape') {
      await selectTab('fences');
      const li = page.locator(`#fence-list [data-fence-id="${cmd.fence_id}"]`);
      await li.locator('[data-action="edit"]').click();
      const vertex = page.locator('.leaflet-marker-pane .marker-icon:not(.marker-icon-middle)').first();
      await vertex.waitFor({ state: 'visible', timeout: 5000 });
      await page.waitForTimeout(600); // fitBounds animation
      const vb = await vertex.boundingBox();
      const sx = vb.x + vb.width / 2, sy = vb.y + vb.height / 2;
      await page.mouse.move(sx, sy);
      await page.mouse.down();
      await page.mouse.move(sx + 45, sy + 35, { steps: 8 }); // inwards: stays on the map
      await page.mouse.up();
      await shot('07-editing-shape');
      await li.locator('[data-action="save-shape"]').click();
      await page.locator(`#fence-list [data-fence-id="${cmd.fence_id}"]:not(.is-editing) [data-action="edit"]`).waitFor({ timeout: 15000 });
      emit({ step: 'shape_saved' });
    } else if (cmd.cmd === 'delete') {
      await selectTab('fences');
      const li = page.locator(`#fence-list [data-fence-id="${cmd.fence_id}"]`);
      await li.locator('[data-action="delete"]').click();
      await li.locator('[data-action="delete-confirm"]').click();
      await li.waitFor({ state: 'detached', timeout: 15000 });
      await shot('08-fence-deleted');
      emit({ step: 'deleted' });
    } else if (cmd.cmd === 'mobile') {
      const mctx = await browser.newContext({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2,
        isMobile: true, hasTouch: true, locale: 'en-GB' });
      await mctx.addInitScript(([key, tiles]) => {
        localStorage.setItem('herdfence.apiKey', key);
        if (localStorage.getItem('herdfence.tileUrl') === null) localStorage.setItem('herdfence.tileUrl', tiles);
      }, [KEY, TILE_URL]);
      const m = await mctx.newPage();
      watch(m, 'mobile');
      await m.goto(API + '/', { waitUntil: 'domcontentloaded' });
      await m.locator('#app').waitFor({ state: 'visible', timeout: 15000 });
      await m.locator('.herd-marker .dot').first().waitFor({ state: 'attached', timeout: 15000 });
      await m.waitForTimeout(800);
      await shot('09-mobile-fences', m);
      await m.click('#tab-herd');
      await shot('10-mobile-herd', m);
      await m.click('#tab-alerts');
      await shot('11-mobile-alerts', m);
      await mctx.close();
      emit({ step: 'mobile_ok' });
    } else {
      throw new Error('unknown command ' + JSON.stringify(cmd));
    }
  }
  emit({ step: 'done', page_errors: pageErrors });
}

run().then(async () => {
  await browser?.close();
  process.exit(0);
}, async (err) => {
  emit({ error: String(err && err.stack || err) });
  try { if (page) await shot('failure'); } catch { /* ignore */ }
  try { await browser?.close(); } catch { /* ignore */ }
  process.exit(1);
});
