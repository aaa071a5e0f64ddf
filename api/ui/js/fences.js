// The Fences tab: the list, drawing a new one, editing corners, name and approach warning, deleting, and strip
// plans (each strip is a fence with an active window; the map shows the active strip and the next ones).
import { state, $ } from './state.js';
import { api, describeError } from './api.js';
import { handleApiFailure, announce, showError } from './notify.js';
import { esc, cssToken, fmtArea, geometryArea, patchList, when } from './util.js';
import { map } from './map.js';
import { startDrawing, stopDrawing, isDrawing } from './draw.js';
import { planFeatures, windowState } from './plan.js';
import { geometryToLatLngs, fenceStyle, upsertFence, styleFence, removeFenceLocal } from './fence-layers.js';
import { selectTab } from './tabs.js';
import { renderAlerts } from './alerts.js';

const MAX_WARN_M = 1000;

export function fenceName(id) {
  const f = state.fences.get(id);
  return f ? (f.feature.properties && f.feature.properties.name) || 'Unnamed fence' : 'a deleted fence (' + id + ')';
}

export async function loadFences() {
  const fc = await api('GET', '/v1/fences');
  const feats = (fc && fc.features) || [];
  const seen = new Set();
  for (const f of feats) {
    const id = f.id != null ? String(f.id) : (f.properties && f.properties.id);
    if (id == null) continue;
    f.id = id;
    seen.add(id);
    upsertFence(f);
  }
  for (const id of Array.from(state.fences.keys())) if (!seen.has(id) && state.editing !== id) removeFenceLocal(id);
  state.fences.forEach((_e, id) => styleFence(id)); // "the next strip" depends on the other fences
  renderFences();
  return feats;
}

function reconcileFences() { loadFences().catch((err) => handleApiFailure(err, 'Loading fences')); }

function insideCounts() {
  const counts = {};
  state.devices.forEach((d) => (d.fences || []).forEach((fid) => { counts[fid] = (counts[fid] || 0) + 1; }));
  return counts;
}

function windowNote(props, win) {
  if (win === 'always') return '';
  const from = props.active_from ? new Date(props.active_from) : null, to = props.active_to ? new Date(props.active_to) : null;
  if (win === 'active') return '<span class="win win--active">Active now' + (to ? ' · until ' + esc(when(to)) : '') + '</span>';
  if (win === 'upcoming') return '<span class="win win--upcoming">Next · from ' + esc(when(from)) + '</span>';
  return '<span class="win win--past">Done · ended ' + esc(when(to)) + '</span>';
}

// Fences sorted by plan: active strips first, then the upcoming ones in order, then the rest by name.
function sortedIds() {
  const rank = { active: 0, upcoming: 1, always: 2, past: 3 };
  return Array.from(state.fences.keys()).sort((a, b) => {
    const pa = state.fences.get(a).feature.properties || {}, pb = state.fences.get(b).feature.properties || {};
    const wa = windowState(pa), wb = windowState(pb);
    if (wa !== wb) return rank[wa] - rank[wb];
    if (wa === 'upcoming') return Date.parse(pa.active_from) - Date.parse(pb.active_from);
    return fenceName(a).localeCompare(fenceName(b), undefined, { numeric: true });
  });
}

function actionsHtml(id, name, props) {
  if (state.editing === id) {
    return '<p class="fence-note">Drag the white corner points on the map. Tap a middle point to add a corner.</p>' +
      '<div class="fence-actions">' +
      '<button type="button" class="btn btn--primary" data-action="save-shape">Save shape</button>' +
      '<button type="button" class="btn btn--ghost-dark" data-action="cancel-shape">Cancel</button></div>';
  }
  if (state.renaming === id) {
    const t = cssToken(id);
    return '<form class="fence-form" data-action="rename-form">' +
      '<label for="rename-' + t + '">Name</label>' +
      '<input type="text" id="rename-' + t + '" name="name" class="rename-input" maxlength="120" value="' + esc(name) + '">' +
      '<label for="warn-' + t + '">Warn when an animal is this close to the edge (metres, 0 = off)</label>' +
      '<input type="number" id="warn-' + t + '" name="warn_m" min="0" max="' + MAX_WARN_M + '" step="1" inputmode="numeric" value="' + esc(props.warn_m || 0) + '">' +
      '<div class="fence-actions"><button type="submit" class="btn btn--primary" data-action="rename-save">Save</button>' +
      '<button type="button" class="btn btn--ghost-dark" data-action="rename-cancel">Cancel</button></div></form>';
  }
  if (state.planning === id) {
    const t = cssToken(id);
    const start = new Date(); start.setMinutes(0, 0, 0);
    const local = new Date(start.getTime() - start.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
    return '<form class="fence-form" data-action="plan-form">' +
      '<p class="fence-note">Cut <strong>' + esc(name) + '</strong> into strips of equal width; each strip is a fence that is active for its own time window, one after the other.</p>' +
      '<label for="plan-n-' + t + '">Number of strips</label>' +
      '<input type="number" id="plan-n-' + t + '" name="strips" min="2" max="20" step="1" inputmode="numeric" value="4">' +
      '<label for="plan-start-' + t + '">First strip starts</label>' +
      '<input type="datetime-local" id="plan-start-' + t + '" name="start" value="' + local + '">' +
      '<label for="plan-hours-' + t + '">Hours on each strip</label>' +
      '<input type="number" id="plan-hours-' + t + '" name="hours" min="1" max="720" step="1" inputmode="numeric" value="24">' +
      '<div class="fence-actions"><button type="submit" class="btn btn--primary" data-action="plan-save">Create strips</button>' +
      '<button type="button" class="btn btn--ghost-dark" data-action="plan-cancel">Cancel</button></div></form>';
  }
  if (state.confirmingDelete === id) {
    return '<p class="fence-note">Delete <strong>' + esc(name) + '</strong>? Animals will no longer be checked against it.</p>' +
      '<div class="fence-actions">' +
      '<button type="button" class="btn btn--danger" data-action="delete-confirm">Yes, delete</button>' +
      '<button type="button" class="btn btn--ghost-dark" data-action="delete-cancel">Keep it</button></div>';
  }
  const canPlan = (state.fences.get(id).feature.geometry || {}).type === 'Polygon' && !props.plan_of;
  return '<div class="fence-actions">' +
    '<button type="button" class="btn btn--ghost-dark" data-action="zoom" aria-label="Show ' + esc(name) + ' on the map">Show</button>' +
    '<button type="button" class="btn btn--ghost-dark" data-action="edit" aria-label="Shape of ' + esc(name) + '">Shape</button>' +
    '<button type="button" class="btn btn--ghost-dark" data-action="rename" aria-label="Name &amp; warning of ' + esc(name) + '">Name &amp; warning</button>' +
    (canPlan ? '<button type="button" class="btn btn--ghost-dark" data-action="plan" aria-label="Strips: plan grazing in ' + esc(name) + '">Strips</button>' : '') +
    '<button type="button" class="btn btn--ghost-dark" data-action="delete" aria-label="Delete ' + esc(name) + '">Delete</button></div>';
}

export function renderFences() {
  const counts = insideCounts();
  const ids = sortedIds();
  $('fence-count').textContent = ids.length;
  $('fence-empty').hidden = ids.length > 0;
  renderPlanSummary(ids);
  patchList($('fence-list'), ids.map((id) => {
    const e = state.fences.get(id);
    const props = e.feature.properties || {};
    const name = fenceName(id);
    const win = windowState(props);
    const n = counts[id] || 0;
    const meta = fmtArea(geometryArea(e.feature.geometry)) + ' · ' + n + (n === 1 ? ' animal' : ' animals') + ' inside' +
      (props.warn_m ? ' · warns at ' + props.warn_m + ' m' : '');
    return '<li class="fence-item' + (state.editing === id ? ' is-editing' : '') + '" data-fence-id="' + esc(id) + '" data-window="' + win + '" data-testid="fence-item">' +
      '<div class="fence-head"><span class="swatch" style="background:' + e.color + '" aria-hidden="true"></span>' +
      '<div class="fence-main"><span class="fence-name">' + esc(name) + '</span><span class="fence-meta">' + esc(meta) + '</span>' +
      windowNote(props, win) + '</div></div>' + actionsHtml(id, name, props) + '</li>';
  }));
}

// "Today: strip 2 until Wed 08:00 · next: strip 3" above the list, when any fence has a window.
function renderPlanSummary(ids) {
  const active = ids.filter((id) => windowState(state.fences.get(id).feature.properties) === 'active' &&
    (state.fences.get(id).feature.properties || {}).active_to);
  const next = ids.filter((id) => windowState(state.fences.get(id).feature.properties) === 'upcoming');
  const el = $('plan-summary');
  if (!active.length && !next.length) { el.hidden = true; el.innerHTML = ''; return; }
  el.hidden = false;
  el.innerHTML = '<strong>Grazing plan.</strong> ' +
    (active.length ? 'Now: <span data-testid="plan-now">' + active.map((id) => esc(fenceName(id))).join(', ') + '</span>. ' : 'No strip is active now. ') +
    (next.length ? 'Next: <span data-testid="plan-next">' + esc(fenceName(next[0])) + '</span> from ' +
      esc(when(new Date(state.fences.get(next[0]).feature.properties.active_from))) + '.' : '');
}

export function focusFence(id) {
  const e = state.fences.get(id);
  if (!e) return;
  map.fitBounds(e.layer.getBounds(), { padding: [30, 30], maxZoom: 18 });
  selectTab('fences');
  const li = $('fence-list').querySelector('[data-fence-id="' + CSS.escape(id) + '"]');
  if (li) li.scrollIntoView({ block: 'nearest' });
}

// ---------------------------------------------------------------- drawing a new fence
export function beginDrawing() {
  if (state.editing) cancelEdit(state.editing);
  startDrawing(onFenceDrawn);
  if (window.matchMedia('(max-width: 899px)').matches) $('draw-bar').scrollIntoView({ block: 'start' });
}

function onFenceDrawn(layer) {
  discardPending();
  state.pendingLayer = layer.addTo(map);
  layer.setStyle({ color: '#2f5d3a', dashArray: '6 6', fillOpacity: 0.18 });
  $('fence-area').textContent = 'Area: ' + fmtArea(geometryArea(layer.toGeoJSON().geometry));
  $('fence-error').textContent = '';
  $('fence-name').value = '';
  $('fence-warn').value = '0';
  $('fence-save').disabled = false;
  const dlg = $('fence-dialog');
  dlg.returnValue = '';
  if (!dlg.open) dlg.showModal();
  setTimeout(() => $('fence-name').focus(), 0);
}

export function discardPending() {
  if (state.pendingLayer) { map.removeLayer(state.pendingLayer); state.pendingLayer = null; }
}

function readWarn(value, report) {
  const text = String(value == null ? '' : value).trim();
  const v = text === '' ? 0 : Number(text);
  if (!Number.isFinite(v) || v < 0 || v > MAX_WARN_M) { report('The warning distance must be between 0 and ' + MAX_WARN_M + ' metres.'); return null; }
  return Math.round(v);
}

export async function savePendingFence(ev) {
  ev.preventDefault();
  const name = $('fence-name').value.trim();
  if (!name) { $('fence-error').textContent = 'Please give the fence a name.'; $('fence-name').focus(); return; }
  const warn = readWarn($('fence-warn').value, (m) => { $('fence-error').textContent = m; });
  if (warn === null) { $('fence-warn').focus(); return; }
  if (!state.pendingLayer) { $('fence-dialog').close(); return; }
  const properties = { name };
  if (warn > 0) properties.warn_m = warn;
  const feature = { type: 'Feature', geometry: state.pendingLayer.toGeoJSON().geometry, properties };
  $('fence-save').disabled = true;
  $('fence-error').textContent = '';
  try {
    const saved = await api('POST', '/v1/fences', feature);
    discardPending();
    $('fence-dialog').close('saved');
    if (saved && saved.id != null) {
      saved.id = String(saved.id);
      if (!saved.geometry) saved.geometry = feature.geometry;
      if (!saved.properties) saved.properties = feature.properties;
      upsertFence(saved);
      renderFences();
      announce('Fence "' + name + '" saved', 'enter');
    }
    await loadFences();
  } catch (err) {
    $('fence-save').disabled = false;
    if (err && err.status === 401) { handleApiFailure(err, 'Saving the fence'); return; }
    $('fence-error').textContent = describeError(err, 'Saving the fence');
  }
}

// ---------------------------------------------------------------- editing corners
function startEdit(id) {
  if (isDrawing()) stopDrawing();
  if (state.editing && state.editing !== id) cancelEdit(state.editing);
  const e = state.fences.get(id);
  if (!e) return;
  state.editing = id; state.renaming = state.planning = state.confirmingDelete = null;
  e.layer.setStyle(fenceStyle(e.color, true));
  e.layer.pm.enable({ allowSelfIntersection: false, snappable: true });
  e.layer.off('pm:edit').on('pm:edit', () => { // live area while dragging corners
    const meta = $('fence-list').querySelector('[data-fence-id="' + CSS.escape(id) + '"] .fence-meta');
    if (meta) meta.textContent = fmtArea(geometryArea(e.layer.toGeoJSON().geometry)) + ' · unsaved shape';
  });
  map.fitBounds(e.layer.getBounds(), { padding: [40, 40], maxZoom: 18 });
  renderFences();
}

export function cancelEdit(id) {
  const e = state.fences.get(id);
  state.editing = null;
  if (e) {
    e.layer.pm.disable();
    e.layer.setLatLngs(geometryToLatLngs(e.feature.geometry));
    styleFence(id);
  }
  renderFences();
}

async function putFence(id, feature, what) {
  try {
    const saved = await api('PUT', '/v1/fences/' + encodeURIComponent(id), feature);
    return saved && saved.geometry ? Object.assign(saved, { id }) : feature;
  } catch (err) {
    handleApiFailure(err, what);
    if (err && err.status === 404) reconcileFences();
    return null;
  }
}

async function saveShape(id) {
  const e = state.fences.get(id);
  if (!e) return;
  const feature = { type: 'Feature', id, geometry: e.layer.toGeoJSON().geometry, properties: Object.assign({}, e.feature.properties || {}) };
  const btn = document.querySelector('[data-fence-id="' + CSS.escape(id) + '"] [data-action="save-shape"]');
  if (btn) btn.disabled = true;
  const saved = await putFence(id, feature, 'Saving the new shape');
  if (!saved) { if (btn) btn.disabled = false; return; }
  e.layer.pm.disable();
  state.editing = null;
  upsertFence(saved);
  renderFences();
  announce('Shape of "' + fenceName(id) + '" saved', 'enter');
}

async function saveDetails(id, form) {
  const e = state.fences.get(id);
  if (!e) return;
  const name = (form.elements.name.value || '').trim();
  if (!name) { showError('A fence needs a name.'); return; }
  const warn = readWarn(form.elements.warn_m.value, showError);
  if (warn === null) return;
  const properties = Object.assign({}, e.feature.properties || {}, { name });
  if (warn > 0) properties.warn_m = warn; else delete properties.warn_m;
  const saved = await putFence(id, { type: 'Feature', id, geometry: e.feature.geometry, properties }, 'Saving the fence');
  if (!saved) return;
  state.renaming = null;
  upsertFence(saved);
  renderFences();
  renderAlerts();
  announce('Saved "' + name + '"' + (warn ? ', warns at ' + warn + ' m' : ''), 'enter');
}

async function savePlan(id, form) {
  const e = state.fences.get(id);
  if (!e) return;
  const n = Number(form.elements.strips.value), hours = Number(form.elements.hours.value);
  const start = new Date(form.elements.start.value);
  if (!Number.isInteger(n) || n < 2 || n > 20) { showError('Choose between 2 and 20 strips.'); return; }
  if (!Number.isFinite(hours) || hours < 1 || hours > 720) { showError('Each strip needs between 1 and 720 hours.'); return; }
  if (isNaN(start.getTime())) { showError('Choose when the first strip starts.'); return; }
  let features;
  try { features = planFeatures(e.feature, n, start, hours); } catch (err) { showError(err.message); return; }
  const btn = form.querySelector('[data-action="plan-save"]');
  if (btn) btn.disabled = true;
  let made = 0;
  for (const f of features) {
    try { await api('POST', '/v1/fences', f); made++; } catch (err) {
      handleApiFailure(err, 'Creating strip ' + f.properties.strip);
      break;
    }
  }
  state.planning = null;
  await loadFences().catch((err) => handleApiFailure(err, 'Loading fences'));
  if (made) { focusFence(id); announce(made + ' strips planned in "' + fenceName(id) + '"', 'enter', 4000); }
}

async function deleteFence(id) {
  const name = fenceName(id);
  try {
    await api('DELETE', '/v1/fences/' + encodeURIComponent(id));
  } catch (err) {
    if (!(err && err.status === 404)) { handleApiFailure(err, 'Deleting the fence'); return; }
  }
  state.confirmingDelete = null;
  removeFenceLocal(id);
  renderFences();
  announce('Fence "' + name + '" deleted', 'enter');
}

function focusIn(id, selector) {
  const el = $('fence-list').querySelector('[data-fence-id="' + CSS.escape(id) + '"] ' + selector);
  if (el) { el.focus(); if (el.select) el.select(); }
}

export function onFenceListClick(ev) {
  const btn = ev.target.closest('[data-action]');
  const li = ev.target.closest('[data-fence-id]');
  if (!btn || !li || btn.tagName === 'FORM') return;
  const id = li.dataset.fenceId;
  const open = (what) => {
    if (state.editing) cancelEdit(state.editing);
    state.renaming = state.planning = state.confirmingDelete = null;
    state[what] = id;
    renderFences();
  };
  switch (btn.dataset.action) {
    case 'zoom': focusFence(id); break;
    case 'edit': startEdit(id); break;
    case 'save-shape': saveShape(id); break;
    case 'cancel-shape': cancelEdit(id); break;
    case 'rename': open('renaming'); focusIn(id, 'input[name="name"]'); break;
    case 'rename-cancel': state.renaming = null; renderFences(); break;
    case 'plan': open('planning'); focusIn(id, 'input[name="strips"]'); break;
    case 'plan-cancel': state.planning = null; renderFences(); break;
    case 'delete': open('confirmingDelete'); focusIn(id, '[data-action="delete-confirm"]'); break;
    case 'delete-confirm': deleteFence(id); break;
    case 'delete-cancel': state.confirmingDelete = null; renderFences(); break;
  }
}

export function onFenceListSubmit(ev) {
  const form = ev.target.closest('form[data-action]');
  if (!form) return;
  ev.preventDefault();
  const id = form.closest('[data-fence-id]').dataset.fenceId;
  if (form.dataset.action === 'rename-form') saveDetails(id, form);
  else if (form.dataset.action === 'plan-form') savePlan(id, form);
}

export function onFenceListKey(ev) {
  if (ev.key === 'Escape' && (state.renaming || state.planning)) { state.renaming = state.planning = null; renderFences(); }
}
