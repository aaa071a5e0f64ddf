// The herd: animals on the map and the Herd tab, with at a glance who is outside every fence, whose
// collar is silent and whose battery is low.
import { state, $, QUIET_MS, LOW_BATTERY } from './state.js';
import { api } from './api.js';
import { handleApiFailure } from './notify.js';
import { esc, cssToken, parseTs, ago, batteryPct, patchList } from './util.js';
import { map, herdGroup, trailGroup, maybeFitOnce } from './map.js';
import { fenceName, renderFences } from './fences.js';
import { setConnected } from './alerts.js';

let posInFlight = false, posAgain = false;
let filter = 'all';

export async function loadPositions() {
  if (!state.key) return;
  if (posInFlight) { posAgain = true; return; }
  posInFlight = true;
  try {
    const fc = await api('GET', '/v1/positions');
    applyPositions((fc && fc.features) || []);
    setConnected(true);
  } catch (err) {
    if (err && err.status === 0 && err.message !== 'stale') setConnected(false);
    else handleApiFailure(err, 'Loading animal positions');
  } finally {
    posInFlight = false;
    if (posAgain) { posAgain = false; loadPositions(); }
  }
}

let refreshTimer = null;
export function refreshSoon() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(loadPositions, 150);
}

function deviceIcon(id, inside, quiet) {
  const st = inside ? 'inside' : 'outside';
  const label = id + (inside ? ' — inside a fence' : ' — outside all fences');
  return L.divIcon({
    className: 'herd-marker herd-marker--' + st + ' device-' + cssToken(id) + (quiet ? ' is-quiet' : ''),
    html: '<span class="dot" data-device-id="' + esc(id) + '" data-state="' + st + '" data-testid="device-marker" role="img" aria-label="' + esc(label) + '"></span>' +
      '<span class="tag">' + esc(id) + '</span>',
    iconSize: [44, 44], iconAnchor: [22, 22], // a fingertip-sized target around the 22 px dot
  });
}

function applyPositions(features) {
  const seen = new Set();
  for (const f of features) {
    const p = f.properties || {};
    const id = p.device_id != null ? String(p.device_id) : (f.id != null ? String(f.id) : null);
    if (id == null || !f.geometry || !f.geometry.coordinates) continue;
    seen.add(id);
    const c = f.geometry.coordinates;
    const ll = L.latLng(c[1], c[0]);
    const fences = Array.isArray(p.fences) ? p.fences.map(String) : [];
    const inside = fences.length > 0;
    const ts = parseTs(p.ts);
    const quiet = !!ts && (Date.now() - ts.getTime() > QUIET_MS);
    let d = state.devices.get(id);
    if (!d) {
      const marker = L.marker(ll, { icon: deviceIcon(id, inside, quiet), title: id, alt: id, keyboard: true, riseOnHover: true, pmIgnore: true });
      marker.on('add', () => { const el = marker.getElement(); if (el) el.setAttribute('data-device-id', id); });
      marker.bindPopup('');
      marker.on('popupopen', () => marker.setPopupContent(popupHtml(id)));
      const trail = L.polyline([ll], { color: '#5a4632', weight: 2, opacity: 0.45, dashArray: '2 5', interactive: false, pmIgnore: true }).addTo(trailGroup);
      d = { id, marker, trail };
      state.devices.set(id, d);
      marker.addTo(herdGroup);
    } else {
      if (!d.marker.getLatLng().equals(ll)) {
        d.marker.setLatLng(ll);
        const pts = d.trail.getLatLngs(); pts.push(ll);
        if (pts.length > 30) pts.shift();
        d.trail.setLatLngs(pts);
      }
      if (d.inside !== inside || d.quiet !== quiet) {
        d.marker.setIcon(deviceIcon(id, inside, quiet));
        const el = d.marker.getElement(); if (el) el.setAttribute('data-device-id', id);
      }
    }
    Object.assign(d, { feature: f, fences, inside, ts, quiet, battery: batteryPct(p.battery), herd: p.herd });
    if (d.marker.isPopupOpen()) d.marker.setPopupContent(popupHtml(id));
  }
  for (const id of Array.from(state.devices.keys())) {
    if (seen.has(id)) continue;
    const d = state.devices.get(id);
    herdGroup.removeLayer(d.marker); trailGroup.removeLayer(d.trail);
    state.devices.delete(id);
  }
  renderDevices();
  renderFences();
  maybeFitOnce();
}

function popupHtml(id) {
  const d = state.devices.get(id);
  if (!d) return esc(id);
  const where = d.inside ? 'Inside ' + d.fences.map((f) => esc(fenceName(f))).join(', ') : '<strong class="text-out">Outside all fences</strong>';
  return '<strong>' + esc(id) + '</strong>' + (d.herd ? ' · herd ' + esc(d.herd) : '') + '<br>' + where +
    '<br>Last seen ' + esc(ago(d.ts)) + (d.battery != null ? '<br>Battery ' + d.battery + '%' : '');
}

const isLow = (d) => d.battery != null && d.battery < LOW_BATTERY;
const FILTERS = { all: () => true, outside: (d) => !d.inside, silent: (d) => d.quiet, battery: isLow };

export function setHerdFilter(name) { filter = FILTERS[name] ? name : 'all'; renderDevices(); }

export function renderDevices() {
  const all = Array.from(state.devices.values());
  // animals that need attention first (outside, then silent, then low battery), then by name
  const need = (d) => (!d.inside ? 0 : d.quiet ? 1 : isLow(d) ? 2 : 3);
  all.sort((a, b) => need(a) - need(b) || a.id.localeCompare(b.id, undefined, { numeric: true }));
  const counts = { all: all.length, outside: all.filter(FILTERS.outside).length, silent: all.filter(FILTERS.silent).length, battery: all.filter(isLow).length };
  $('herd-count').textContent = all.length;
  $('device-empty').hidden = all.length > 0;
  $('herd-glance').hidden = all.length === 0;
  for (const [name, n] of Object.entries(counts)) {
    const chip = $('glance-' + name);
    chip.querySelector('.n').textContent = n;
    chip.setAttribute('aria-pressed', filter === name ? 'true' : 'false');
    chip.dataset.alert = name !== 'all' && n > 0 ? 'yes' : 'no';
  }
  const shown = all.filter(FILTERS[filter]);
  patchList($('device-list'), shown.map((d) => {
    const id = d.id, st = d.inside ? 'inside' : 'outside';
    const where = (d.inside ? 'In ' + d.fences.map(fenceName).join(', ') : 'Outside every fence') + (d.herd ? ' · herd ' + d.herd : '');
    const batt = d.battery == null ? '<span class="battery">battery —</span>' :
      '<span class="battery' + (isLow(d) ? ' is-low' : '') + '" title="Battery ' + d.battery + '%">' +
      '<span class="battery-bar" aria-hidden="true"><span class="battery-fill" style="width:' + d.battery + '%"></span></span>' + d.battery + '%</span>';
    const flags = (d.inside ? '' : '<span class="flag flag--out">outside</span>') + (d.quiet ? '<span class="flag flag--silent">silent</span>' : '') +
      (isLow(d) ? '<span class="flag flag--battery">low battery</span>' : '');
    // one button per animal inside a plain <li>: list semantics stay, the name is what is shown
    return '<li class="device-row' + (d.quiet ? ' is-quiet' : '') + '" data-device-id="' + esc(id) + '" data-state="' + st + '" data-testid="device-item">' +
      '<button type="button" class="device-item" title="Show ' + esc(id) + ' on the map">' +
      '<span class="state-dot" data-state="' + st + '" aria-hidden="true"></span>' +
      '<div class="device-main"><div class="device-name">' + esc(id) + ' ' + flags + '</div>' +
      '<div class="device-where' + (d.inside ? '' : ' is-out') + '">' + esc(where) + '</div></div>' +
      '<div class="device-side"><div class="last-seen" title="' + esc(d.ts ? d.ts.toISOString() : '') + '">' + esc(ago(d.ts)) + '</div>' + batt + '</div></button></li>';
  }));
}

export function focusDevice(id) {
  const d = state.devices.get(id);
  if (!d) return;
  map.setView(d.marker.getLatLng(), Math.max(map.getZoom(), 16));
  d.marker.openPopup();
}
