// Drawing a fence by tapping its corners, made for a phone: nothing is laid over the map while drawing
// (the controls live in a bar above it, the map's own buttons are hidden), every corner has a 44 px
// target, the last corner can be undone, and there is no tooltip to get stuck under a finger.
// Geoman's draw mode is not used: its action bar opened across the map where the next tap would land.
import { $ } from './state.js';
import { map } from './map.js';

const MIN_CORNERS = 3;
let points = [];
let markers = [];
let outline = null;
let onDone = null;

export const isDrawing = () => onDone !== null;

export function startDrawing(done) {
  if (isDrawing()) stopDrawing();
  onDone = done;
  points = []; markers = [];
  outline = L.polygon([], { pane: 'drawing', color: '#1f3d27', weight: 3, dashArray: '6 6', fillOpacity: 0.15,
    interactive: false }).addTo(map);
  map.getContainer().classList.add('is-drawing');
  map.doubleClickZoom.disable(); // two quick taps are two corners, not a zoom
  map.on('click', onMapTap);
  document.addEventListener('keydown', onKey);
  $('draw-bar').hidden = false;
  update();
}

export function stopDrawing() {
  if (!isDrawing()) return;
  map.off('click', onMapTap);
  document.removeEventListener('keydown', onKey);
  markers.forEach((m) => map.removeLayer(m));
  if (outline) map.removeLayer(outline);
  points = []; markers = []; outline = null; onDone = null;
  map.doubleClickZoom.enable();
  map.getContainer().classList.remove('is-drawing');
  $('draw-bar').hidden = true;
}

export function undoCorner() {
  if (!points.length) return;
  points.pop();
  map.removeLayer(markers.pop());
  update();
}

export function finishDrawing() {
  if (points.length < MIN_CORNERS) return;
  const done = onDone;
  const layer = L.polygon(points.slice(), { color: '#2f5d3a', weight: 3 });
  stopDrawing();
  done(layer);
}

function onMapTap(e) {
  points.push(e.latlng);
  const first = points.length === 1;
  const marker = L.marker(e.latlng, { pane: 'drawing', keyboard: false, bubblingMouseEvents: false,
    icon: L.divIcon({ className: 'draw-corner' + (first ? ' draw-corner--first' : ''), iconSize: [44, 44],
      html: '<span></span>' }) }).addTo(map);
  // tapping the first corner again closes the ring (its target is as big as a fingertip)
  if (first) marker.on('click', () => finishDrawing());
  markers.push(marker);
  update();
}

function onKey(ev) {
  if (ev.key === 'Escape') stopDrawing();
  else if ((ev.key === 'z' && (ev.ctrlKey || ev.metaKey)) || ev.key === 'Backspace') {
    if (ev.target && /INPUT|TEXTAREA/.test(ev.target.tagName)) return;
    ev.preventDefault(); undoCorner();
  } else if (ev.key === 'Enter' && points.length >= MIN_CORNERS && ev.target === document.body) finishDrawing();
}

function update() {
  outline.setLatLngs(points);
  const n = points.length;
  $('draw-undo').disabled = n === 0;
  $('draw-finish').disabled = n < MIN_CORNERS;
  // short texts in a bar of fixed height: the map under it must not move between two taps
  $('draw-text').textContent = n === 0 ? 'Tap the first corner of the paddock.'
    : n < MIN_CORNERS ? `${n} corner${n > 1 ? 's' : ''}. Tap the next corner.`
      : `${n} corners. Tap the yellow corner or Finish to close.`;
  $('draw-bar').dataset.corners = String(n);
}
