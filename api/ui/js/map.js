// The map: Leaflet with optional tiles, a lat/lon grid and scale bar that always work offline, and the
// layer groups the other views draw into. Leaflet (L) and Leaflet-Geoman are classic scripts before us.
import { state, $, LS_TILES, LS_VIEW } from './state.js';

export const DEFAULT_TILES = 'https://tile.openstreetmap.org/{z}/{x}/{y}.png';
const DEFAULT_CENTER = [59.8172, 17.6560]; // open farmland; overridden by saved view / fitting your data
const DEFAULT_ZOOM = 15;
const TRANSPARENT_PNG = 'data:image/gif;base64,R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7';
const LEAFLET_PREFIX = '<a href="https://leafletjs.com" target="_blank" rel="noopener">Leaflet</a>';

export let map = null;
export let fenceGroup, herdGroup, trailGroup;
let tileLayer = null;

export function initMap() {
  let view = null;
  try { view = JSON.parse(localStorage.getItem(LS_VIEW) || 'null'); } catch { view = null; }
  map = L.map('map', {
    center: view ? [view.lat, view.lng] : DEFAULT_CENTER,
    zoom: view ? view.zoom : DEFAULT_ZOOM,
    maxZoom: 21, minZoom: 2, zoomControl: true, worldCopyJump: true,
  });
  map.createPane('graticule');
  map.getPane('graticule').style.zIndex = 250;
  map.getPane('graticule').classList.add('leaflet-graticule-pane');
  map.createPane('fenceLabels'); // fence names sit above the polygons but below the animals
  map.getPane('fenceLabels').style.zIndex = 550;
  map.getPane('fenceLabels').style.pointerEvents = 'none';
  map.createPane('drawing'); // the corners being placed sit above everything else
  map.getPane('drawing').style.zIndex = 700;

  L.control.scale({ imperial: true, metric: true, position: 'bottomleft' }).addTo(map);
  trailGroup = L.layerGroup().addTo(map);
  fenceGroup = L.featureGroup().addTo(map);
  herdGroup = L.featureGroup().addTo(map);
  new Graticule().addTo(map);
  setTiles(localStorage.getItem(LS_TILES) === null ? DEFAULT_TILES : localStorage.getItem(LS_TILES));

  if (window.ResizeObserver) { // the error banner, the drawing bar or a rotated phone change the map's size
    new ResizeObserver(() => map.invalidateSize({ pan: false })).observe($('map'));
  }
  map.on('moveend', () => {
    const c = map.getCenter();
    localStorage.setItem(LS_VIEW, JSON.stringify({ lat: c.lat, lng: c.lng, zoom: map.getZoom() }));
  });
  // Geoman only edits existing fences' corners (drawing is ours, see draw.js): no toolbar, no tooltips
  // (a tooltip follows the mouse and stays stuck on a touch screen).
  map.pm.setGlobalOptions({ allowSelfIntersection: false, snappable: true, snapDistance: 15, tooltips: false });
  // the zoom buttons and attribution get real names for screen readers
  map.getContainer().querySelectorAll('.leaflet-control-zoom a').forEach((a) => a.setAttribute('role', 'button'));
  return map;
}

export function setTiles(url) {
  if (tileLayer) { map.removeLayer(tileLayer); tileLayer = null; }
  const container = map.getContainer();
  setTileNote(false);
  url = (url || '').trim();
  if (!url) { container.classList.add('no-tiles'); return; }
  container.classList.remove('no-tiles');
  let errors = 0, loaded = 0;
  tileLayer = L.tileLayer(url, {
    maxZoom: 21, maxNativeZoom: 19, errorTileUrl: TRANSPARENT_PNG,
    attribution: /openstreetmap\.org/.test(url) ? '&copy; <a href="https://www.openstreetmap.org/copyright" target="_blank" rel="noopener">OpenStreetMap</a> contributors' : '',
  });
  tileLayer.on('tileerror', () => {
    errors++;
    if (errors >= 2 && loaded === 0) { setTileNote(true); container.classList.add('no-tiles'); }
  });
  tileLayer.on('tileload', (e) => {
    if (e.tile && e.tile.src === TRANSPARENT_PNG) return; // the placeholder for a failed tile
    loaded++;
    setTileNote(false); container.classList.remove('no-tiles');
  });
  tileLayer.addTo(map);
}

function setTileNote(on) {
  map.attributionControl.setPrefix((on ? '<span id="tile-note" data-testid="tile-note">Map tiles offline</span> · ' : '') + LEAFLET_PREFIX);
}

export function fitAll() {
  const b = L.latLngBounds([]);
  state.fences.forEach((e) => b.extend(e.layer.getBounds()));
  state.devices.forEach((d) => b.extend(d.marker.getLatLng()));
  if (b.isValid()) map.fitBounds(b, { padding: [30, 30], maxZoom: 17 });
}

export function maybeFitOnce() {
  if (state.fittedOnce) return;
  state.fittedOnce = true;
  if (localStorage.getItem(LS_VIEW)) return; // respect the farmer's last view
  fitAll();
}

// Lat/lon grid that adapts to the zoom level; drawn in its own non-interactive pane.
const Graticule = L.Layer.extend({
  onAdd(m) {
    this._group = L.layerGroup().addTo(m);
    m.on('moveend zoomend resize', this._draw, this);
    this._draw();
  },
  onRemove(m) { m.off('moveend zoomend resize', this._draw, this); m.removeLayer(this._group); },
  _draw() {
    const m = this._map, g = this._group;
    g.clearLayers();
    const b = m.getBounds(), size = m.getSize();
    if (!size.x || !size.y) return;
    const span = Math.max(b.getEast() - b.getWest(), 1e-9);
    const steps = [45, 30, 20, 10, 5, 2, 1, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001, 0.0005, 0.0002, 0.0001, 0.00005];
    const target = size.x / 130; // about one line per 130 px
    let step = steps[steps.length - 1];
    for (const s of steps) { if (span / s >= target * 0.75) { step = s; break; } }
    const dec = Math.max(0, Math.ceil(-Math.log10(step) + 0.0001));
    const south = Math.max(b.getSouth(), -85), north = Math.min(b.getNorth(), 85);
    const style = { pane: 'graticule', interactive: false, color: '#4d7a57', weight: 1, opacity: 0.35 };
    const labelOpts = (html) => ({ pane: 'graticule', interactive: false, keyboard: false,
      icon: L.divIcon({ className: 'grat-label', html, iconSize: null, iconAnchor: [-3, -3] }) });
    let n = 0;
    for (let x = Math.floor(b.getWest() / step) * step; x <= b.getEast() && n < 80; x += step, n++) {
      const lon = +x.toFixed(8);
      g.addLayer(L.polyline([[south, lon], [north, lon]], style));
      const px = m.latLngToContainerPoint([north, lon]).x;
      if (px < 64 || px > size.x - 150) continue; // keep clear of the controls and the latitude labels
      const wrapped = ((lon + 540) % 360) - 180;
      g.addLayer(L.marker(m.containerPointToLatLng([px, 2]), labelOpts(Math.abs(wrapped).toFixed(dec) + '°' + (wrapped < 0 ? 'W' : 'E'))));
    }
    n = 0;
    for (let y = Math.floor(south / step) * step; y <= north && n < 80; y += step, n++) {
      const lat = +y.toFixed(8);
      g.addLayer(L.polyline([[lat, b.getWest()], [lat, b.getEast()]], style));
      const p = m.latLngToContainerPoint([lat, b.getWest()]);
      if (p.y < 40 || p.y > size.y - 30) continue;
      g.addLayer(L.marker(m.containerPointToLatLng([size.x - 70, p.y - 16]), labelOpts(Math.abs(lat).toFixed(dec) + '°' + (lat < 0 ? 'S' : 'N'))));
    }
  },
});
