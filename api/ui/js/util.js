// Small pure helpers: escaping, times, areas, list patching.
const PALETTE = ['#2b7bb9', '#8e44ad', '#d35400', '#16a085', '#c0392b', '#2c3e50', '#b7950b', '#7d3c98'];

export function esc(s) {
  return String(s == null ? '' : s).replace(/[&<>"']/g, (c) =>
    ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
}
export const cssToken = (s) => String(s).replace(/[^A-Za-z0-9_-]/g, '_');

export function parseTs(ts) {
  if (ts == null || ts === '') return null;
  const d = new Date(ts);
  return isNaN(d.getTime()) ? null : d;
}
export function ago(date) {
  if (!date) return 'never';
  const s = Math.round((Date.now() - date.getTime()) / 1000);
  if (s < 5) return 'just now';
  if (s < 60) return s + ' s ago';
  const m = Math.round(s / 60);
  if (m < 60) return m + ' min ago';
  const h = Math.round(m / 60);
  if (h < 48) return h + ' h ago';
  return Math.round(h / 24) + ' days ago';
}
export function clock(date) {
  if (!date) return '';
  const sameDay = new Date().toDateString() === date.toDateString();
  const t = date.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
  return sameDay ? t : date.toLocaleDateString() + ' ' + t;
}
export function when(date) { // short day + time for plan windows
  if (!date) return '';
  return date.toLocaleString([], { weekday: 'short', day: 'numeric', month: 'short', hour: '2-digit', minute: '2-digit' });
}
export function shortWhen(date) { // for map labels: the time today, else weekday and time
  const t = date.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
  return new Date().toDateString() === date.toDateString() ? t : date.toLocaleDateString([], { weekday: 'short' }) + ' ' + t;
}
export function duration(seconds) {
  if (seconds < 60) return Math.round(seconds) + ' s';
  const m = Math.round(seconds / 60);
  if (m < 60) return m + ' min';
  const h = Math.floor(m / 60), r = m % 60;
  return h + ' h' + (r ? ' ' + r + ' min' : '');
}
export function batteryPct(b) {
  if (b == null || b === '' || isNaN(Number(b))) return null;
  let v = Number(b);
  if (v > 0 && v <= 1 && !Number.isInteger(v)) v = v * 100; // a fraction
  return Math.max(0, Math.min(100, Math.round(v)));
}
export function colorFor(id) {
  let h = 0;
  const s = String(id);
  for (let i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) >>> 0;
  return PALETTE[h % PALETTE.length];
}
// geodesic area of a ring of [lon, lat] in m² (same formula as Leaflet.draw's GeometryUtil)
function ringArea(ring) {
  const R = 6378137, rad = Math.PI / 180, n = ring.length;
  let area = 0;
  if (n < 3) return 0;
  for (let i = 0; i < n; i++) {
    const p1 = ring[i], p2 = ring[(i + 1) % n];
    area += (p2[0] - p1[0]) * rad * (2 + Math.sin(p1[1] * rad) + Math.sin(p2[1] * rad));
  }
  return Math.abs(area * R * R / 2);
}
export function geometryArea(g) {
  if (!g) return 0;
  const polys = g.type === 'Polygon' ? [g.coordinates] : g.type === 'MultiPolygon' ? g.coordinates : [];
  return polys.reduce((sum, rings) => sum + rings.reduce((s, r, i) => s + (i === 0 ? 1 : -1) * ringArea(r), 0), 0);
}
export function fmtArea(m2) {
  if (m2 >= 10000) return (m2 / 10000).toFixed(m2 >= 1e6 ? 0 : 1) + ' ha';
  return Math.round(m2) + ' m²';
}

// Update a list in place: only <li>s whose markup changed are replaced, so a periodic refresh never
// swallows a tap or steals the focus / half-typed text of an untouched row.
const tpl = document.createElement('template');
export function patchList(list, htmls) {
  const kids = list.children;
  for (let i = 0; i < htmls.length; i++) {
    const old = kids[i];
    if (old && old._html === htmls[i]) continue;
    tpl.innerHTML = htmls[i];
    const el = tpl.content.firstElementChild;
    el._html = htmls[i];
    if (!old) { list.appendChild(el); continue; }
    const active = document.activeElement;
    const focusInfo = active && old.contains(active)
      ? { action: active.dataset.action, input: active.tagName === 'INPUT', name: active.name, value: active.value } : null;
    list.replaceChild(el, old);
    if (focusInfo) {
      const t = focusInfo.input ? el.querySelector(focusInfo.name ? `input[name="${focusInfo.name}"]` : 'input')
        : focusInfo.action ? el.querySelector(`[data-action="${focusInfo.action}"]`) : null;
      if (t) { t.focus(); if (focusInfo.input) t.value = focusInfo.value; } else if (el.tabIndex >= 0) el.focus();
    }
  }
  while (kids.length > htmls.length) list.removeChild(list.lastElementChild);
}
