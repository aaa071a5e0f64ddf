// Fences on the map: their polygons styled by window (a strip plan's active strip solid, the next ones
// dashed, finished ones faint) and their labels. The Fences tab (fences.js) drives them.
import { state } from './state.js';
import { esc, colorFor, shortWhen } from './util.js';
import { fenceGroup } from './map.js';
import { isDrawing } from './draw.js';
import { windowState } from './plan.js';
import { focusFence, renderFences } from './fences.js';

export function geometryToLatLngs(g) {
  if (g.type === 'Polygon') return L.GeoJSON.coordsToLatLngs(g.coordinates, 1);
  if (g.type === 'MultiPolygon') return L.GeoJSON.coordsToLatLngs(g.coordinates, 2);
  return [];
}

// A strip waiting for its window is dashed and pale, a finished one faint; the active one is solid.
export function fenceStyle(color, editing, win) {
  if (editing) return { color, weight: 4, opacity: 0.95, fillColor: color, fillOpacity: 0.22, dashArray: '6 6' };
  if (win === 'upcoming') return { color, weight: 2, opacity: 0.8, fillColor: color, fillOpacity: 0.05, dashArray: '4 6' };
  if (win === 'past') return { color: '#7a847e', weight: 1, opacity: 0.5, fillColor: '#7a847e', fillOpacity: 0.03, dashArray: '2 6' };
  return { color, weight: 3, opacity: 0.95, fillColor: color, fillOpacity: win === 'active' ? 0.2 : 0.12, dashArray: null };
}

function labelText(feature) {
  const props = feature.properties || {};
  // a strip's label stays short: strips sit side by side and long labels would cover each other
  const name = props.strip ? 'Strip ' + props.strip : props.name || 'Unnamed fence';
  const win = windowState(props);
  if (win === 'active' && props.active_to) return name + ' · now';
  if (win === 'upcoming') return name + ' · ' + shortWhen(new Date(props.active_from));
  return name;
}

export function upsertFence(feature) {
  const id = String(feature.id);
  let entry = state.fences.get(id);
  if (entry && state.editing === id) { entry.feature.properties = feature.properties; return entry; }
  const color = entry ? entry.color : colorFor(id);
  const latlngs = geometryToLatLngs(feature.geometry || {});
  if (!entry) {
    const layer = L.polygon(latlngs, fenceStyle(color));
    layer.on('click', () => { if (!isDrawing()) focusFence(id); });
    layer.addTo(fenceGroup);
    entry = { feature, layer, color };
    state.fences.set(id, entry);
  } else {
    entry.feature = feature;
    entry.layer.setLatLngs(latlngs);
  }
  styleFence(id);
  return entry;
}

// (Re)apply the style and label for the fence's window now; called again as windows open and close.
export function styleFence(id) {
  const entry = state.fences.get(id);
  if (!entry || state.editing === id) return;
  const win = windowState(entry.feature.properties);
  entry.win = win;
  entry.layer.setStyle(fenceStyle(entry.color, false, win));
  // rebind the label only when it changes, and take the old one off the page ourselves: a permanent
  // tooltip rebound on every refresh was left behind in the label pane
  const text = win === 'past' || (win === 'upcoming' && !isNextStrip(entry.feature)) || hasLiveStrips(id)
    ? null : labelText(entry.feature);
  const key = text && [text, win, JSON.stringify(entry.feature.geometry)].join('|');
  if (entry.labelKey !== key) {
    const old = entry.layer.getTooltip();
    if (old) { const oldEl = old.getElement(); entry.layer.unbindTooltip(); if (oldEl) oldEl.remove(); }
    if (text) {
      // the next strip's label sits a line lower than the active one's: side by side they would overlap
      entry.layer.bindTooltip(esc(text), { permanent: true, direction: 'center', offset: win === 'upcoming' ? [0, 30] : [0, 0],
        className: 'fence-label fence-label--' + win, pane: 'fenceLabels', interactive: false });
    }
    entry.labelKey = key;
  }
  const el = entry.layer.getElement && entry.layer.getElement();
  if (el) { el.setAttribute('data-fence-id', id); el.setAttribute('data-window', win); el.classList.add('fence-shape'); }
}

// Of a plan's strips still to come, only the next one is labelled: narrow strips side by side would
// otherwise bury each other's labels (the list says when each one starts).
// A paddock cut into strips that are active or still to come: its strips carry the labels.
function hasLiveStrips(id) {
  for (const other of state.fences.values()) {
    const p = other.feature.properties || {};
    if (p.plan_of === id && windowState(p) !== 'past') return true;
  }
  return false;
}

function isNextStrip(feature) {
  const props = feature.properties || {};
  if (props.plan_of == null) return true;
  const from = Date.parse(props.active_from);
  for (const other of state.fences.values()) {
    const p = other.feature.properties || {};
    if (p.plan_of === props.plan_of && other.feature !== feature && windowState(p) === 'upcoming' &&
        Date.parse(p.active_from) < from) return false;
  }
  return true;
}

export function restyleWindows() {
  let changed = false;
  state.fences.forEach((e) => { if (windowState(e.feature.properties) !== e.win) changed = true; });
  if (!changed) return;
  state.fences.forEach((_e, id) => styleFence(id));
  renderFences();
}

export function removeFenceLocal(id) {
  const entry = state.fences.get(id);
  if (!entry) return;
  if (entry.layer.pm && entry.layer.pm.enabled()) entry.layer.pm.disable();
  fenceGroup.removeLayer(entry.layer);
  state.fences.delete(id);
}
