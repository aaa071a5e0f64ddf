// The farmer's whole flow on a phone (390×844, touch), driven by tests/stack/test_ui.py: every action is a
// tap (page.touchscreen.tap); text is typed into the focused field. Steps are commands from pytest, which
// posts GPS reports and checks the API in between. Screenshots: HF_ARTIFACTS/phone-*.png.
import { API, KEY, emit, nextCommand, shot, watch, launch, withOfflineTiles, axe, run, pageErrors } from './lib.mjs';

let page;

async function tapAt(x, y) { await page.touchscreen.tap(x, y); await page.waitForTimeout(120); }
async function tap(locator) {
  await locator.scrollIntoViewIfNeeded();
  const b = await locator.boundingBox();
  if (!b) throw new Error('not visible: ' + locator);
  await tapAt(b.x + b.width / 2, b.y + b.height / 2);
}
async function type(locator, text) { await tap(locator); await locator.fill(text); }

// Visible controls smaller than a fingertip (44 × 44 CSS px; inline links in text are exempt).
async function smallTargets() {
  return page.evaluate(() => Array.from(document.querySelectorAll('button, [role="button"], [role="tab"], input, select, .leaflet-bar a'))
    .filter((el) => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0 && getComputedStyle(el).visibility !== 'hidden'; })
    .filter((el) => { const r = el.getBoundingClientRect(); return r.width < 44 || r.height < 44; })
    .map((el) => (el.id ? '#' + el.id : el.tagName.toLowerCase() + '.' + el.className) + ` ${Math.round(el.getBoundingClientRect().width)}x${Math.round(el.getBoundingClientRect().height)}`));
}

// What a tap at (x, y) would hit: must be the map itself (a corner), never a control laid over it.
async function hitAt(x, y) {
  return page.evaluate(([x, y]) => {
    const el = document.elementFromPoint(x, y);
    if (!el) return 'nothing';
    if (!el.closest('#map')) return 'outside the map: ' + (el.id || el.className || el.tagName);
    const ctl = el.closest('.leaflet-control, .leaflet-pm-actions-container, .leaflet-tooltip, .button-container');
    return ctl ? 'control: ' + ctl.className : 'map';
  }, [x, y]);
}

async function signIn() {
  await page.goto(API + '/', { waitUntil: 'domcontentloaded' });
  await page.locator('#login-key').waitFor({ state: 'visible', timeout: 15000 });
  const axeLogin = await axe(page);
  await shot(page, 'phone-00-sign-in');
  await type(page.locator('#login-key'), 'not-a-real-key');
  await tap(page.locator('#login-btn'));
  await page.waitForFunction(() => document.querySelector('#login-error').textContent.trim().length > 0, null, { timeout: 15000 });
  await type(page.locator('#login-key'), KEY);
  await tap(page.locator('#login-btn'));
  await page.locator('#app').waitFor({ state: 'visible', timeout: 15000 });
  await page.waitForFunction(() => document.querySelector('#conn-status').dataset.state !== 'connecting', null, { timeout: 15000 });
  await page.waitForTimeout(500);
  const axeApp = await axe(page);
  await shot(page, 'phone-01-signed-in');
  return { axe_login: axeLogin, axe_app: axeApp, small_targets: await smallTargets() };
}

async function drawFence(cmd) {
  await tap(page.locator('#draw-fence-btn'));
  await page.locator('#draw-bar').waitFor({ state: 'visible', timeout: 5000 });
  await page.waitForTimeout(300); // the map shrinks under the bar
  const box = await page.locator('#map').boundingBox();
  // corners near the map's top edge and right edge: where Geoman's action bar used to sit
  const pts = [[box.x + box.width * 0.22, box.y + 14], [box.x + box.width - 12, box.y + 20],
    [box.x + box.width - 16, box.y + box.height * 0.62], [box.x + box.width * 0.25, box.y + box.height * 0.7]];
  const hits = [];
  const tooltips = [];
  for (const [x, y] of pts) {
    hits.push(await hitAt(x, y));
    await tapAt(x, y);
    tooltips.push(await page.locator('.leaflet-tooltip:not(.fence-label), .leaflet-pm-tooltip').count());
  }
  // a slip of the finger, then "Undo corner"
  const sx = box.x + box.width * 0.5, sy = box.y + box.height * 0.95;
  await tapAt(sx, sy);
  const before = Number(await page.locator('#draw-bar').getAttribute('data-corners'));
  await shot(page, 'phone-02-drawing');
  await tap(page.locator('#draw-undo'));
  const after = Number(await page.locator('#draw-bar').getAttribute('data-corners'));
  const barSmall = await smallTargets();
  hits.push(await hitAt(pts[0][0], pts[0][1]) === 'map' ? 'map' : 'moved: ' + await hitAt(pts[0][0], pts[0][1]));
  await tapAt(pts[0][0], pts[0][1]); // the first corner again closes the fence
  const dialog = page.locator('#fence-dialog');
  await dialog.waitFor({ state: 'visible', timeout: 5000 });
  await type(page.locator('#fence-name'), cmd.name);
  await type(page.locator('#fence-warn'), String(cmd.warn_m));
  const axeDialog = await axe(page);
  const dialogSmall = await smallTargets();
  await shot(page, 'phone-03-name-fence');
  await tap(page.locator('#fence-save'));
  await dialog.waitFor({ state: 'hidden', timeout: 15000 });
  const item = page.locator('#fence-list [data-fence-id]', { hasText: cmd.name });
  await item.waitFor({ state: 'visible', timeout: 15000 });
  if (await page.locator('#error-banner').isVisible()) throw new Error('error banner: ' + (await page.textContent('#error-text')));
  await shot(page, 'phone-04-fence-saved');
  return { fence_id: await item.getAttribute('data-fence-id'), hits, tooltips, corners_before_undo: before,
    corners_after_undo: after, small_targets: barSmall.concat(dialogSmall), axe_dialog: axeDialog, meta: (await item.locator('.fence-meta').textContent()).trim() };
}

async function selectTab(name) {
  await tap(page.locator('#tab-' + name));
  await page.locator('#panel-' + name).waitFor({ state: 'visible' });
}

async function waitAlert(cmd) {
  await selectTab('alerts');
  const sel = `#alerts li[data-type="${cmd.type}"][data-device-id="${cmd.device_id}"]`;
  await page.locator(sel).first().waitFor({ state: 'attached', timeout: cmd.timeout_ms || 40000 });
  const li = page.locator(sel).first();
  const out = { text: (await li.textContent()).trim(), icon: await li.evaluate((el) => getComputedStyle(el.querySelector('.alert-icon')).backgroundColor),
    // did this very alert flash the map? (the EXIT alarm marks the page with the event it flashed for)
    flash: await li.evaluate((el) => document.body.getAttribute('data-last-exit') === el.dataset.eventId),
    alerts: await page.locator('#alerts li').evaluateAll((els) => els.map((e) => e.dataset.type)),
    toast: (await page.textContent('#toast')).trim() };
  await shot(page, 'phone-05-alert-' + cmd.type);
  return out;
}

async function plan(cmd) {
  await selectTab('fences');
  const li = page.locator(`#fence-list [data-fence-id="${cmd.fence_id}"]`);
  await tap(li.locator('[data-action="plan"]'));
  await type(li.locator('input[name="strips"]'), String(cmd.strips));
  await li.locator('input[name="start"]').fill(cmd.start_local); // the date picker is the OS's own
  await type(li.locator('input[name="hours"]'), String(cmd.hours));
  await shot(page, 'phone-06-plan-form');
  const formSmall = await smallTargets();
  const axeForm = await axe(page);
  await tap(li.locator('[data-action="plan-save"]'));
  await page.locator('#plan-summary').waitFor({ state: 'visible', timeout: 15000 });
  await page.waitForFunction((n) => document.querySelectorAll('#fence-list [data-fence-id]').length >= n, cmd.strips + 1, { timeout: 15000 });
  await page.waitForTimeout(800); // the map zooms to the paddock
  await shot(page, 'phone-07-plan-map');
  return { ...(await planState()), small_targets: formSmall, axe_form: axeForm };
}

async function planState() {
  return page.evaluate(() => ({
    now: document.querySelector('[data-testid="plan-now"]')?.textContent || null,
    next: document.querySelector('[data-testid="plan-next"]')?.textContent || null,
    windows: Array.from(document.querySelectorAll('#map path.fence-shape')).map((p) => p.getAttribute('data-window')),
    labels: Array.from(document.querySelectorAll('.fence-label')).map((t) => t.textContent),
  }));
}

// A finger dragging from (x0, y0) to (x1, y1): Playwright's touchscreen only taps, so the touch points
// go through the DevTools protocol, as a real touch screen's would.
async function touchDrag(x0, y0, x1, y1) {
  const cdp = await page.context().newCDPSession(page);
  await cdp.send('Input.dispatchTouchEvent', { type: 'touchStart', touchPoints: [{ x: x0, y: y0 }] });
  for (let i = 1; i <= 8; i++) {
    await cdp.send('Input.dispatchTouchEvent', { type: 'touchMove', touchPoints: [{ x: x0 + (x1 - x0) * i / 8, y: y0 + (y1 - y0) * i / 8 }] });
    await page.waitForTimeout(30);
  }
  await cdp.send('Input.dispatchTouchEvent', { type: 'touchEnd', touchPoints: [] });
  await cdp.detach();
}

async function editShape(cmd) {
  await selectTab('fences');
  const li = page.locator(`#fence-list [data-fence-id="${cmd.fence_id}"]`);
  await tap(li.locator('[data-action="edit"]'));
  const vertex = page.locator('.leaflet-marker-pane .marker-icon:not(.marker-icon-middle)').first();
  await vertex.waitFor({ state: 'visible', timeout: 5000 });
  await page.waitForTimeout(600); // fitBounds animation
  const vb = await vertex.boundingBox();
  const map = await page.locator('#map').boundingBox();
  const sx = vb.x + vb.width / 2, sy = vb.y + vb.height / 2;
  // drag towards the map's centre: stays on the map
  const tx = sx + Math.sign(map.x + map.width / 2 - sx) * 40, ty = sy + Math.sign(map.y + map.height / 2 - sy) * 30;
  await touchDrag(sx, sy, tx, ty);
  await shot(page, 'phone-06b-editing-shape');
  await tap(li.locator('[data-action="save-shape"]'));
  await page.locator(`#fence-list [data-fence-id="${cmd.fence_id}"]:not(.is-editing) [data-action="edit"]`).waitFor({ timeout: 15000 });
  return { handle: [Math.round(vb.width), Math.round(vb.height)] };
}

async function rename(cmd) {
  await selectTab('fences');
  const li = page.locator(`#fence-list [data-fence-id="${cmd.fence_id}"]`);
  await tap(li.locator('[data-action="rename"]'));
  await type(li.locator('input[name="name"]'), cmd.name);
  await type(li.locator('input[name="warn_m"]'), String(cmd.warn_m));
  await tap(li.locator('[data-action="rename-save"]'));
  await page.locator(`#fence-list [data-fence-id="${cmd.fence_id}"] .fence-name`, { hasText: cmd.name }).waitFor({ timeout: 15000 });
  return { meta: (await page.locator(`#fence-list [data-fence-id="${cmd.fence_id}"] .fence-meta`).textContent()).trim() };
}

async function herd(cmd) {
  await selectTab('herd');
  await page.locator(`#tip-chart [data-device-id="${cmd.device_id}"]`).first().waitFor({ state: 'attached', timeout: 15000 });
  const glance = await page.evaluate(() => Object.fromEntries(['all', 'outside', 'silent', 'battery']
    .map((k) => [k, Number(document.querySelector('#glance-' + k + ' .n').textContent)])));
  const tip = await page.locator(`#tip-chart [data-device-id="${cmd.device_id}"]`).first().getAttribute('data-seconds');
  await page.locator('#tip-chart').scrollIntoViewIfNeeded();
  await shot(page, 'phone-08-herd');
  await tap(page.locator('#glance-outside'));
  const outsideRows = await page.locator('#device-list [data-device-id]').count();
  await tap(page.locator('#glance-all'));
  return { glance, tip_seconds: Number(tip), outside_rows: outsideRows, axe_herd: await axe(page) };
}

async function del(cmd) {
  await selectTab('fences');
  const li = page.locator(`#fence-list [data-fence-id="${cmd.fence_id}"]`);
  await tap(li.locator('[data-action="delete"]'));
  await tap(li.locator('[data-action="delete-confirm"]'));
  await li.waitFor({ state: 'detached', timeout: 15000 });
  await shot(page, 'phone-09-deleted');
}

async function main() {
  if (!KEY) throw new Error('HF_API_KEY is not set');
  const browser = await launch();
  const context = await browser.newContext({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2,
    isMobile: true, hasTouch: true, locale: 'en-GB' });
  await withOfflineTiles(context);
  page = await context.newPage();
  watch(page, 'phone');
  emit({ step: 'signed_in', ...(await signIn()) });
  for (;;) {
    const cmd = await nextCommand();
    if (cmd.cmd === 'quit') break;
    if (cmd.cmd === 'draw') emit({ step: 'fence_drawn', ...(await drawFence(cmd)) });
    else if (cmd.cmd === 'wait_alert') emit({ step: 'alert_' + cmd.type, ...(await waitAlert(cmd)) });
    else if (cmd.cmd === 'plan') emit({ step: 'planned', ...(await plan(cmd)) });
    else if (cmd.cmd === 'reload_plan') {
      await page.evaluate(() => window.herdfence.reload());
      await page.waitForFunction((want) => (document.querySelector('[data-testid="plan-now"]')?.textContent || '').includes(want), cmd.want_now, { timeout: 15000 });
      await shot(page, 'phone-07b-plan-next-window');
      emit({ step: 'plan_reloaded', ...(await planState()) });
    } else if (cmd.cmd === 'edit_shape') emit({ step: 'shape_saved', ...(await editShape(cmd)) });
    else if (cmd.cmd === 'rename') emit({ step: 'renamed', ...(await rename(cmd)) });
    else if (cmd.cmd === 'herd') emit({ step: 'herd', ...(await herd(cmd)) });
    else if (cmd.cmd === 'delete') { await del(cmd); emit({ step: 'deleted' }); }
    else throw new Error('unknown command ' + JSON.stringify(cmd));
  }
  emit({ step: 'done', page_errors: pageErrors });
  return browser;
}

run(main, () => page);
