/* herdfence web UI — vanilla JS, no build step.
 * Talks only to the herdfence HTTP API (same origin) with "Authorization: Bearer <farm key>".
 * Leaflet draws the map, Geoman draws/edits fence polygons. Works offline: tiles are optional,
 * a plain background + graticule + scale bar are always there. */
(function () {
  'use strict';

  var LS_KEY = 'herdfence.apiKey';
  var LS_TILES = 'herdfence.tileUrl';
  var LS_VIEW = 'herdfence.view';
  var LS_SOUND = 'herdfence.sound';
  var DEFAULT_TILES = 'https://tile.openstreetmap.org/{z}/{x}/{y}.png';
  var DEFAULT_CENTER = [59.8172, 17.6560]; // open farmland; overridden by saved view / fitting your data
  var DEFAULT_ZOOM = 15;
  var POS_POLL_MS = 2500;
  var EVENTS_POLL_LIVE_MS = 10000;   // safety net while the SSE stream is up
  var EVENTS_POLL_DOWN_MS = 3000;    // when the SSE stream is down
  var QUIET_MS = 15 * 60 * 1000;     // a device silent this long is shown as "quiet"
  var MAX_ALERTS = 200;
  var PALETTE = ['#2b7bb9', '#8e44ad', '#d35400', '#16a085', '#c0392b', '#2c3e50', '#b7950b', '#7d3c98'];
  var TRANSPARENT_PNG = 'data:image/gif;base64,R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7';

  // ---------------------------------------------------------------- state
  var state = {
    key: null,
    fences: new Map(),      // id -> {feature, layer, color}
    devices: new Map(),     // device_id -> {feature, marker, trail, lastLatLng}
    events: [],             // sorted oldest -> newest
    eventIds: new Set(),
    editing: null,          // fence id whose shape is being edited
    renaming: null,
    confirmingDelete: null,
    pendingLayer: null,     // freshly drawn, not yet saved
    es: null,
    esLive: false,
    timers: [],
    unseenExits: 0,
    activeTab: 'fences',
    audio: null,
    sound: localStorage.getItem(LS_SOUND) !== 'off',
    fittedOnce: false,
    generation: 0,          // bumps on sign-out so stale responses are dropped
    sseEvents: 0,           // fence events received over the live stream (diagnostics)
  };
  var map, tileLayer, graticule, fenceGroup, herdGroup, trailGroup;

  var $ = function (id) { return document.getElementById(id); };

  // ---------------------------------------------------------------- API
  function ApiError(status, message) { this.status = status; this.message = message; }
  ApiError.prototype = Object.create(Error.prototype);

  function formatDetail(detail) {
    if (detail == null) return '';
    if (typeof detail === 'string') return detail;
    if (Array.isArray(detail)) {
      return detail.map(function (d) {
        if (d && typeof d === 'object') {
          var loc = Array.isArray(d.loc) ? d.loc.filter(function (x) { return x !== 'body'; }).join('.') : '';
          return (loc ? loc + ': ' : '') + (d.msg || JSON.stringify(d));
        }
        return String(d);
      }).join('; ');
    }
    if (typeof detail === 'object') return detail.message || detail.msg || JSON.stringify(detail);
    return String(detail);
  }

  function api(method, path, body, keyOverride) {
    var key = keyOverride || state.key;
    var gen = state.generation;
    var opts = { method: method, headers: { 'Accept': 'application/json' } };
    if (key) opts.headers['Authorization'] = 'Bearer ' + key;
    if (body !== undefined) {
      opts.headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    return fetch(path, opts).then(function (res) {
      if (gen !== state.generation && !keyOverride) throw new ApiError(0, 'stale');
      if (res.status === 204) return null;
      return res.text().then(function (text) {
        var data = null;
        try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
        if (!res.ok) {
          var msg = data && data.detail !== undefined ? formatDetail(data.detail) : (text || res.statusText);
          throw new ApiError(res.status, msg || ('HTTP ' + res.status));
        }
        return data;
      });
    }, function (err) {
      throw new ApiError(0, 'Cannot reach the herdfence server (' + (err && err.message || 'network error') + ')');
    });
  }

  function describeError(err, what) {
    if (!err) return what + ' failed';
    var status = err.status ? ' (' + err.status + ')' : '';
    return what + ' failed' + status + ': ' + err.message;
  }

  function showError(msg) {
    $('error-text').textContent = msg;
    $('error-banner').hidden = false;
  }
  function clearError() { $('error-banner').hidden = true; $('error-text').textContent = ''; }

  function handleApiFailure(err, what) {
    if (err && err.message === 'stale') return;
    if (err && err.status === 401) { signOut('Your farm key was not accepted any more. Please sign in again.'); return; }
    showError(describeError(err, what));
  }

  // ---------------------------------------------------------------- helpers
  function esc(s) {
    return String(s == null ? '' : s).replace(/[&<>"']/g, function (c) {
      return { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c];
    });
  }
  function cssToken(s) { return String(s).replace(/[^A-Za-z0-9_-]/g, '_'); }
  function parseTs(ts) {
    if (ts == null) return null;
    if (typeof ts === 'number') return new Date(ts);
    var d = new Date(ts);
    return isNaN(d.getTime()) ? null : d;
  }
  function ago(date) {
    if (!date) return 'never';
    var s = Math.round((Date.now() - date.getTime()) / 1000);
    if (s < 5) return 'just now';
    if (s < 60) return s + ' s ago';
    var m = Math.round(s / 60);
    if (m < 60) return m + ' min ago';
    var h = Math.round(m / 60);
    if (h < 48) return h + ' h ago';
    return Math.round(h / 24) + ' days ago';
  }
  function clock(date) {
    if (!date) return '';
    var sameDay = new Date().toDateString() === date.toDateString();
    var t = date.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
    return sameDay ? t : date.toLocaleDateString() + ' ' + t;
  }
  function batteryPct(b) {
    if (b == null || b === '' || isNaN(Number(b))) return null;
    var v = Number(b);
    if (v > 0 && v <= 1 && !Number.isInteger(v)) v = v * 100; // a fraction
    return Math.max(0, Math.min(100, Math.round(v)));
  }
  function colorFor(id) {
    var h = 0, s = String(id);
    for (var i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) >>> 0;
    return PALETTE[h % PALETTE.length];
  }
  // geodesic area of a ring of [lon, lat] in m² (same formula as Leaflet.draw's GeometryUtil)
  function ringArea(ring) {
    var R = 6378137, area = 0, n = ring.length, rad = Math.PI / 180;
    if (n < 3) return 0;
    for (var i = 0; i < n; i++) {
      var p1 = ring[i], p2 = ring[(i + 1) % n];
      area += (p2[0] - p1[0]) * rad * (2 + Math.sin(p1[1] * rad) + Math.sin(p2[1] * rad));
    }
    return Math.abs(area * R * R / 2);
  }
  function geometryArea(g) {
    if (!g) return 0;
    var polys = g.type === 'Polygon' ? [g.coordinates] : g.type === 'MultiPolygon' ? g.coordinates : [];
    return polys.reduce(function (sum, rings) {
      return sum + rings.reduce(function (s, r, i) { return s + (i === 0 ? 1 : -1) * ringArea(r); }, 0);
    }, 0);
  }
  function fmtArea(m2) {
    if (m2 >= 10000) return (m2 / 10000).toFixed(m2 >= 1e6 ? 0 : 1) + ' ha';
    return Math.round(m2) + ' m²';
  }
  function fenceName(id) {
    var f = state.fences.get(id);
    return f ? (f.feature.properties && f.feature.properties.name) || 'Unnamed fence' : 'fence ' + id;
  }

  // Update a list in place: only <li>s whose markup changed are replaced, so a periodic refresh never
  // swallows a click or steals the focus / half-typed text of an untouched row.
  var tpl = document.createElement('template');
  function patchList(list, htmls) {
    var kids = list.children;
    for (var i = 0; i < htmls.length; i++) {
      var old = kids[i];
      if (old && old._html === htmls[i]) continue;
      tpl.innerHTML = htmls[i];
      var el = tpl.content.firstElementChild;
      el._html = htmls[i];
      if (!old) { list.appendChild(el); continue; }
      var active = document.activeElement;
      var focusInfo = active && old.contains(active) ? { action: active.dataset.action, input: active.tagName === 'INPUT', value: active.value } : null;
      list.replaceChild(el, old);
      if (focusInfo) {
        var t = focusInfo.input ? el.querySelector('input') : focusInfo.action ? el.querySelector('[data-action="' + focusInfo.action + '"]') : null;
        if (t) { t.focus(); if (focusInfo.input) t.value = focusInfo.value; } else if (el.tabIndex >= 0) el.focus();
      }
    }
    while (kids.length > htmls.length) list.removeChild(list.lastElementChild);
  }

  // ---------------------------------------------------------------- map
  function initMap() {
    var view = null;
    try { view = JSON.parse(localStorage.getItem(LS_VIEW) || 'null'); } catch (e) { view = null; }
    map = L.map('map', {
      center: view ? [view.lat, view.lng] : DEFAULT_CENTER,
      zoom: view ? view.zoom : DEFAULT_ZOOM,
      maxZoom: 21, minZoom: 2, zoomControl: true, worldCopyJump: true, tap: true,
    });
    map.createPane('graticule');
    map.getPane('graticule').style.zIndex = 250;
    map.getPane('graticule').classList.add('leaflet-graticule-pane');
    map.createPane('fenceLabels'); // fence names sit above the polygons but below the animals
    map.getPane('fenceLabels').style.zIndex = 550;
    map.getPane('fenceLabels').style.pointerEvents = 'none';

    L.control.scale({ imperial: true, metric: true, position: 'bottomleft' }).addTo(map);

    trailGroup = L.layerGroup().addTo(map);
    fenceGroup = L.featureGroup().addTo(map);
    herdGroup = L.featureGroup().addTo(map);
    graticule = new Graticule().addTo(map);
    setTiles(localStorage.getItem(LS_TILES) === null ? DEFAULT_TILES : localStorage.getItem(LS_TILES));

    if (window.ResizeObserver) { // the error banner or a rotated phone changes the map's size
      new ResizeObserver(function () { map.invalidateSize({ pan: false }); }).observe($('map'));
    }
    map.on('moveend', function () {
      var c = map.getCenter();
      localStorage.setItem(LS_VIEW, JSON.stringify({ lat: c.lat, lng: c.lng, zoom: map.getZoom() }));
    });

    // Geoman: polygon + rectangle drawing only; editing is per fence from the list.
    map.pm.setGlobalOptions({ allowSelfIntersection: false, snappable: true, snapDistance: 15,
      templineStyle: { color: '#2f5d3a' }, hintlineStyle: { color: '#2f5d3a', dashArray: [5, 5] },
      pathOptions: { color: '#2f5d3a', weight: 3, fillOpacity: 0.15 } });
    map.pm.addControls({
      position: 'topleft', drawMarker: false, drawCircleMarker: false, drawPolyline: false,
      drawRectangle: true, drawPolygon: true, drawCircle: false, drawText: false, editMode: false,
      dragMode: false, cutPolygon: false, removalMode: false, rotateMode: false,
    });
    map.on('pm:drawstart', function () { $('draw-hint').hidden = false; });
    map.on('pm:drawend', function () { $('draw-hint').hidden = true; });
    map.on('pm:create', function (e) { onFenceDrawn(e.layer); });
  }

  function setTiles(url) {
    if (tileLayer) { map.removeLayer(tileLayer); tileLayer = null; }
    var container = map.getContainer();
    setTileNote(false);
    url = (url || '').trim();
    if (!url) { container.classList.add('no-tiles'); return; }
    container.classList.remove('no-tiles');
    var errors = 0, loaded = 0;
    tileLayer = L.tileLayer(url, {
      maxZoom: 21, maxNativeZoom: 19, errorTileUrl: TRANSPARENT_PNG,
      attribution: /openstreetmap\.org/.test(url) ? '&copy; <a href="https://www.openstreetmap.org/copyright" target="_blank" rel="noopener">OpenStreetMap</a> contributors' : '',
    });
    tileLayer.on('tileerror', function () {
      errors++;
      if (errors >= 2 && loaded === 0) { setTileNote(true); container.classList.add('no-tiles'); }
    });
    tileLayer.on('tileload', function (e) {
      if (e.tile && e.tile.src === TRANSPARENT_PNG) return; // the placeholder for a failed tile
      loaded++;
      setTileNote(false); container.classList.remove('no-tiles');
    });
    tileLayer.addTo(map);
  }

  var LEAFLET_PREFIX = '<a href="https://leafletjs.com" target="_blank" rel="noopener">Leaflet</a>';
  function setTileNote(on) {
    map.attributionControl.setPrefix((on ? '<span id="tile-note" data-testid="tile-note">Map tiles offline</span> · ' : '') + LEAFLET_PREFIX);
  }

  // Lat/lon grid that adapts to the zoom level; drawn in its own non-interactive pane.
  var Graticule = L.Layer.extend({
    onAdd: function (m) {
      this._group = L.layerGroup().addTo(m);
      m.on('moveend zoomend resize', this._draw, this);
      this._draw();
    },
    onRemove: function (m) { m.off('moveend zoomend resize', this._draw, this); m.removeLayer(this._group); },
    _draw: function () {
      var m = this._map, g = this._group;
      g.clearLayers();
      var b = m.getBounds(), size = m.getSize();
      if (!size.x || !size.y) return;
      var span = Math.max(b.getEast() - b.getWest(), 1e-9);
      var steps = [45, 30, 20, 10, 5, 2, 1, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001, 0.0005, 0.0002, 0.0001, 0.00005];
      var target = size.x / 130; // about one line per 130 px
      var step = steps[steps.length - 1];
      for (var i = 0; i < steps.length; i++) { if (span / steps[i] >= target * 0.75) { step = steps[i]; break; } }
      var dec = Math.max(0, Math.ceil(-Math.log10(step) + 0.0001));
      var south = Math.max(b.getSouth(), -85), north = Math.min(b.getNorth(), 85);
      var style = { pane: 'graticule', interactive: false, color: '#4d7a57', weight: 1, opacity: 0.35 };
      var labelOpts = function (html) {
        return { pane: 'graticule', interactive: false, keyboard: false,
          icon: L.divIcon({ className: 'grat-label', html: html, iconSize: null, iconAnchor: [-3, -3] }) };
      };
      var x0 = Math.floor(b.getWest() / step) * step, n = 0;
      for (var x = x0; x <= b.getEast() && n < 80; x += step, n++) {
        var lon = +x.toFixed(8);
        g.addLayer(L.polyline([[south, lon], [north, lon]], style));
        var px = m.latLngToContainerPoint([north, lon]).x;
        if (px < 64 || px > size.x - 150) continue; // keep clear of the controls and the latitude labels
        var wrapped = ((lon + 540) % 360) - 180;
        var txt = Math.abs(wrapped).toFixed(dec) + '°' + (wrapped < 0 ? 'W' : 'E');
        g.addLayer(L.marker(m.containerPointToLatLng([px, 2]), labelOpts(txt)));
      }
      var y0 = Math.floor(south / step) * step; n = 0;
      for (var y = y0; y <= north && n < 80; y += step, n++) {
        var lat = +y.toFixed(8);
        g.addLayer(L.polyline([[lat, b.getWest()], [lat, b.getEast()]], style));
        var txt2 = Math.abs(lat).toFixed(dec) + '°' + (lat < 0 ? 'S' : 'N');
        var p = m.latLngToContainerPoint([lat, b.getWest()]);
        if (p.y < 40 || p.y > size.y - 30) continue;
        g.addLayer(L.marker(m.containerPointToLatLng([size.x - 70, p.y - 16]), labelOpts(txt2)));
      }
    },
  });

  // ---------------------------------------------------------------- fences
  function geometryToLatLngs(g) {
    if (g.type === 'Polygon') return L.GeoJSON.coordsToLatLngs(g.coordinates, 1);
    if (g.type === 'MultiPolygon') return L.GeoJSON.coordsToLatLngs(g.coordinates, 2);
    return [];
  }

  function fenceStyle(color, editing) {
    return { color: color, weight: editing ? 4 : 3, opacity: 0.95, fillColor: color,
      fillOpacity: editing ? 0.22 : 0.12, dashArray: editing ? '6 6' : null };
  }

  function loadFences() {
    return api('GET', '/v1/fences').then(function (fc) {
      var feats = (fc && fc.features) || [];
      var seen = new Set();
      feats.forEach(function (f) {
        var id = f.id != null ? String(f.id) : (f.properties && f.properties.id);
        if (id == null) return;
        f.id = id;
        seen.add(id);
        upsertFence(f);
      });
      Array.from(state.fences.keys()).forEach(function (id) { if (!seen.has(id) && state.editing !== id) removeFenceLocal(id); });
      renderFences();
      return feats;
    });
  }

  function upsertFence(feature) {
    var id = String(feature.id);
    var entry = state.fences.get(id);
    if (entry && state.editing === id) { entry.feature.properties = feature.properties; return entry; }
    var color = entry ? entry.color : colorFor(id);
    var latlngs = geometryToLatLngs(feature.geometry || {});
    if (!entry) {
      var layer = L.polygon(latlngs, fenceStyle(color));
      layer.options.pmIgnore = false;
      layer.on('click', function () { focusFence(id); });
      layer.addTo(fenceGroup);
      entry = { feature: feature, layer: layer, color: color };
      state.fences.set(id, entry);
    } else {
      entry.feature = feature;
      entry.layer.setLatLngs(latlngs);
    }
    var name = (feature.properties && feature.properties.name) || 'Unnamed fence';
    entry.layer.unbindTooltip();
    entry.layer.bindTooltip(esc(name), { permanent: true, direction: 'center', className: 'fence-label', pane: 'fenceLabels', interactive: false });
    var el = entry.layer.getElement && entry.layer.getElement();
    if (el) { el.setAttribute('data-fence-id', id); el.classList.add('fence-shape'); }
    return entry;
  }

  // after a 404 (fence removed elsewhere, e.g. another phone): reload the list from the server
  function reconcileFences() { loadFences().catch(function (err) { handleApiFailure(err, 'Loading fences'); }); }

  function removeFenceLocal(id) {
    var entry = state.fences.get(id);
    if (!entry) return;
    if (entry.layer.pm && entry.layer.pm.enabled()) entry.layer.pm.disable();
    fenceGroup.removeLayer(entry.layer);
    state.fences.delete(id);
  }

  function insideCounts() {
    var counts = {};
    state.devices.forEach(function (d) {
      (d.fences || []).forEach(function (fid) { counts[fid] = (counts[fid] || 0) + 1; });
    });
    return counts;
  }

  function renderFences() {
    var list = $('fence-list');
    var counts = insideCounts();
    var ids = Array.from(state.fences.keys()).sort(function (a, b) {
      return fenceName(a).localeCompare(fenceName(b));
    });
    $('fence-count').textContent = ids.length;
    $('fence-empty').hidden = ids.length > 0;
    patchList(list, ids.map(function (id) {
      var e = state.fences.get(id);
      var name = fenceName(id);
      var n = counts[id] || 0;
      var meta = fmtArea(geometryArea(e.feature.geometry)) + ' · ' + n + (n === 1 ? ' animal' : ' animals') + ' inside';
      var actions;
      if (state.editing === id) {
        actions = '<p class="fence-note">Drag the white corner points on the map. Click a middle point to add a corner.</p>' +
          '<div class="fence-actions">' +
          '<button type="button" class="btn btn--primary" data-action="save-shape">Save shape</button>' +
          '<button type="button" class="btn btn--ghost-dark" data-action="cancel-shape">Cancel</button></div>';
      } else if (state.renaming === id) {
        actions = '<form class="fence-rename" data-action="rename-form">' +
          '<input type="text" id="rename-' + cssToken(id) + '" class="rename-input" maxlength="120" value="' + esc(name) + '" aria-label="New name for ' + esc(name) + '">' +
          '<button type="submit" class="btn btn--primary btn--small" data-action="rename-save">Save</button>' +
          '<button type="button" class="btn btn--ghost-dark btn--small" data-action="rename-cancel">Cancel</button></form>';
      } else if (state.confirmingDelete === id) {
        actions = '<p class="fence-note">Delete <strong>' + esc(name) + '</strong>? Animals will no longer be checked against it.</p>' +
          '<div class="fence-actions">' +
          '<button type="button" class="btn btn--danger" data-action="delete-confirm">Yes, delete</button>' +
          '<button type="button" class="btn btn--ghost-dark" data-action="delete-cancel">Keep it</button></div>';
      } else {
        actions = '<div class="fence-actions">' +
          '<button type="button" class="btn btn--ghost-dark" data-action="zoom" aria-label="Show ' + esc(name) + ' on the map">Show</button>' +
          '<button type="button" class="btn btn--ghost-dark" data-action="edit" aria-label="Edit the shape of ' + esc(name) + '">Edit shape</button>' +
          '<button type="button" class="btn btn--ghost-dark" data-action="rename" aria-label="Rename ' + esc(name) + '">Rename</button>' +
          '<button type="button" class="btn btn--ghost-dark" data-action="delete" aria-label="Delete ' + esc(name) + '">Delete</button></div>';
      }
      return '<li class="fence-item' + (state.editing === id ? ' is-editing' : '') + '" data-fence-id="' + esc(id) + '" data-testid="fence-item">' +
        '<div class="fence-head"><span class="swatch" style="background:' + e.color + '" aria-hidden="true"></span>' +
        '<div class="fence-main"><span class="fence-name">' + esc(name) + '</span><span class="fence-meta">' + esc(meta) + '</span></div></div>' +
        actions + '</li>';
    }));
  }

  function focusFence(id) {
    var e = state.fences.get(id);
    if (!e) return;
    map.fitBounds(e.layer.getBounds(), { padding: [30, 30], maxZoom: 18 });
    selectTab('fences');
    var li = $('fence-list').querySelector('[data-fence-id="' + CSS.escape(id) + '"]');
    if (li) li.scrollIntoView({ block: 'nearest' });
  }

  function onFenceDrawn(layer) {
    if (state.pendingLayer) map.removeLayer(state.pendingLayer);
    state.pendingLayer = layer;
    layer.setStyle({ color: '#2f5d3a', dashArray: '6 6', fillOpacity: 0.18 });
    var gj = layer.toGeoJSON();
    $('fence-area').textContent = 'Area: ' + fmtArea(geometryArea(gj.geometry));
    $('fence-error').textContent = '';
    $('fence-name').value = '';
    $('fence-save').disabled = false;
    var dlg = $('fence-dialog');
    dlg.returnValue = '';
    if (!dlg.open) dlg.showModal();
    setTimeout(function () { $('fence-name').focus(); }, 0);
  }

  function discardPending() {
    if (state.pendingLayer) { map.removeLayer(state.pendingLayer); state.pendingLayer = null; }
  }

  function savePendingFence(ev) {
    ev.preventDefault();
    var name = $('fence-name').value.trim();
    if (!name) { $('fence-error').textContent = 'Please give the fence a name.'; $('fence-name').focus(); return; }
    if (!state.pendingLayer) { $('fence-dialog').close(); return; }
    var gj = state.pendingLayer.toGeoJSON();
    var feature = { type: 'Feature', geometry: gj.geometry, properties: { name: name } };
    $('fence-save').disabled = true;
    $('fence-error').textContent = '';
    api('POST', '/v1/fences', feature).then(function (saved) {
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
      return loadFences();
    }).catch(function (err) {
      $('fence-save').disabled = false;
      if (err && err.status === 401) { handleApiFailure(err, 'Saving the fence'); return; }
      $('fence-error').textContent = describeError(err, 'Saving the fence');
    });
  }

  function startEdit(id) {
    if (state.editing && state.editing !== id) cancelEdit(state.editing);
    var e = state.fences.get(id);
    if (!e) return;
    state.editing = id; state.renaming = null; state.confirmingDelete = null;
    e.layer.setStyle(fenceStyle(e.color, true));
    e.layer.pm.enable({ allowSelfIntersection: false, snappable: true });
    e.layer.off('pm:edit').on('pm:edit', function () { // live area while dragging corners
      var meta = $('fence-list').querySelector('[data-fence-id="' + CSS.escape(id) + '"] .fence-meta');
      if (meta) meta.textContent = fmtArea(geometryArea(e.layer.toGeoJSON().geometry)) + ' · unsaved shape';
    });
    map.fitBounds(e.layer.getBounds(), { padding: [40, 40], maxZoom: 18 });
    renderFences();
  }

  function cancelEdit(id) {
    var e = state.fences.get(id);
    if (e) {
      e.layer.pm.disable();
      e.layer.setStyle(fenceStyle(e.color, false));
      e.layer.setLatLngs(geometryToLatLngs(e.feature.geometry));
    }
    state.editing = null;
    renderFences();
  }

  function saveShape(id) {
    var e = state.fences.get(id);
    if (!e) return;
    var gj = e.layer.toGeoJSON();
    var feature = { type: 'Feature', id: id, geometry: gj.geometry,
      properties: Object.assign({}, e.feature.properties || {}) };
    var btn = document.querySelector('[data-fence-id="' + CSS.escape(id) + '"] [data-action="save-shape"]');
    if (btn) btn.disabled = true;
    api('PUT', '/v1/fences/' + encodeURIComponent(id), feature).then(function (saved) {
      e.layer.pm.disable();
      e.layer.setStyle(fenceStyle(e.color, false));
      state.editing = null;
      e.feature = saved && saved.geometry ? Object.assign(saved, { id: id }) : feature;
      upsertFence(e.feature);
      renderFences();
      announce('Shape of "' + fenceName(id) + '" saved', 'enter');
    }).catch(function (err) {
      if (btn) btn.disabled = false;
      handleApiFailure(err, 'Saving the new shape');
      if (err && err.status === 404) { cancelEdit(id); reconcileFences(); }
    });
  }

  function saveRename(id, newName) {
    var e = state.fences.get(id);
    if (!e) return;
    newName = (newName || '').trim();
    if (!newName) { showError('A fence needs a name.'); return; }
    var feature = { type: 'Feature', id: id, geometry: e.feature.geometry,
      properties: Object.assign({}, e.feature.properties || {}, { name: newName }) };
    api('PUT', '/v1/fences/' + encodeURIComponent(id), feature).then(function (saved) {
      state.renaming = null;
      upsertFence(saved && saved.geometry ? Object.assign(saved, { id: id }) : feature);
      renderFences();
      renderAlerts();
      announce('Renamed to "' + newName + '"', 'enter');
    }).catch(function (err) {
      handleApiFailure(err, 'Renaming the fence');
      if (err && err.status === 404) { state.renaming = null; reconcileFences(); }
    });
  }

  function deleteFence(id) {
    var name = fenceName(id);
    api('DELETE', '/v1/fences/' + encodeURIComponent(id)).then(function () {
      state.confirmingDelete = null;
      removeFenceLocal(id);
      renderFences();
      announce('Fence "' + name + '" deleted', 'enter');
    }).catch(function (err) {
      if (err && err.status === 404) { state.confirmingDelete = null; removeFenceLocal(id); renderFences(); return; }
      handleApiFailure(err, 'Deleting the fence');
    });
  }

  function onFenceListClick(ev) {
    var btn = ev.target.closest('[data-action]');
    var li = ev.target.closest('[data-fence-id]');
    if (!btn || !li || btn.tagName === 'FORM') return;
    var id = li.dataset.fenceId;
    switch (btn.dataset.action) {
      case 'zoom': focusFence(id); break;
      case 'edit': startEdit(id); break;
      case 'save-shape': saveShape(id); break;
      case 'cancel-shape': cancelEdit(id); break;
      case 'rename':
        if (state.editing) cancelEdit(state.editing);
        state.renaming = id; state.confirmingDelete = null; renderFences();
        var input = $('fence-list').querySelector('[data-fence-id="' + CSS.escape(id) + '"] input');
        if (input) { input.focus(); input.select(); }
        break;
      case 'rename-cancel': state.renaming = null; renderFences(); break;
      case 'delete':
        if (state.editing) cancelEdit(state.editing);
        state.confirmingDelete = id; state.renaming = null; renderFences();
        var yes = $('fence-list').querySelector('[data-fence-id="' + CSS.escape(id) + '"] [data-action="delete-confirm"]');
        if (yes) yes.focus();
        break;
      case 'delete-confirm': deleteFence(id); break;
      case 'delete-cancel': state.confirmingDelete = null; renderFences(); break;
    }
  }

  function onFenceListSubmit(ev) {
    var form = ev.target.closest('form[data-action="rename-form"]');
    if (!form) return;
    ev.preventDefault();
    var li = form.closest('[data-fence-id]');
    saveRename(li.dataset.fenceId, form.querySelector('input').value);
  }

  // ---------------------------------------------------------------- herd
  var posInFlight = false, posAgain = false;
  function loadPositions() {
    if (!state.key) return Promise.resolve();
    if (posInFlight) { posAgain = true; return Promise.resolve(); }
    posInFlight = true;
    return api('GET', '/v1/positions').then(function (fc) {
      applyPositions((fc && fc.features) || []);
      setConnected(true);
    }).catch(function (err) {
      if (err && err.status === 0 && err.message !== 'stale') setConnected(false);
      else handleApiFailure(err, 'Loading animal positions');
    }).then(function () {
      posInFlight = false;
      if (posAgain) { posAgain = false; loadPositions(); }
    });
  }

  var refreshTimer = null;
  function refreshSoon() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(loadPositions, 150);
  }

  function deviceIcon(id, inside, quiet) {
    var st = inside ? 'inside' : 'outside';
    var label = id + (inside ? ' — inside a fence' : ' — outside all fences');
    return L.divIcon({
      className: 'herd-marker herd-marker--' + st + ' device-' + cssToken(id) + (quiet ? ' is-quiet' : ''),
      html: '<span class="dot" data-device-id="' + esc(id) + '" data-state="' + st + '" data-testid="device-marker" role="img" aria-label="' + esc(label) + '"></span>' +
        '<span class="tag">' + esc(id) + '</span>',
      iconSize: [22, 22], iconAnchor: [11, 11],
    });
  }

  function applyPositions(features) {
    var seen = new Set();
    features.forEach(function (f) {
      var p = f.properties || {};
      var id = p.device_id != null ? String(p.device_id) : (f.id != null ? String(f.id) : null);
      if (id == null || !f.geometry || !f.geometry.coordinates) return;
      seen.add(id);
      var c = f.geometry.coordinates;
      var ll = L.latLng(c[1], c[0]);
      var fences = Array.isArray(p.fences) ? p.fences.map(String) : [];
      var inside = fences.length > 0;
      var ts = parseTs(p.ts);
      var quiet = ts && (Date.now() - ts.getTime() > QUIET_MS);
      var d = state.devices.get(id);
      if (!d) {
        var marker = L.marker(ll, { icon: deviceIcon(id, inside, quiet), title: id, alt: id, keyboard: true, riseOnHover: true, pmIgnore: true });
        marker.on('add', function () {
          var el = marker.getElement();
          if (el) { el.setAttribute('data-device-id', id); }
        });
        marker.bindPopup('');
        marker.on('popupopen', function () { marker.setPopupContent(popupHtml(id)); });
        var trail = L.polyline([ll], { color: '#5a4632', weight: 2, opacity: 0.45, dashArray: '2 5', interactive: false, pmIgnore: true }).addTo(trailGroup);
        d = { id: id, marker: marker, trail: trail };
        state.devices.set(id, d);
        marker.addTo(herdGroup);
      } else {
        var prev = d.marker.getLatLng();
        if (!prev.equals(ll)) {
          d.marker.setLatLng(ll);
          var pts = d.trail.getLatLngs(); pts.push(ll);
          if (pts.length > 30) pts.shift();
          d.trail.setLatLngs(pts);
        }
        if (d.inside !== inside || d.quiet !== quiet) {
          d.marker.setIcon(deviceIcon(id, inside, quiet));
          var el = d.marker.getElement(); if (el) el.setAttribute('data-device-id', id);
        }
      }
      d.feature = f; d.fences = fences; d.inside = inside; d.ts = ts; d.quiet = quiet;
      d.battery = batteryPct(p.battery); d.herd = p.herd;
      if (d.marker.isPopupOpen()) d.marker.setPopupContent(popupHtml(id));
    });
    Array.from(state.devices.keys()).forEach(function (id) {
      if (!seen.has(id)) {
        var d = state.devices.get(id);
        herdGroup.removeLayer(d.marker); trailGroup.removeLayer(d.trail);
        state.devices.delete(id);
      }
    });
    renderDevices();
    renderFences();
    maybeFitOnce();
  }

  function popupHtml(id) {
    var d = state.devices.get(id);
    if (!d) return esc(id);
    var where = d.inside ? 'Inside ' + d.fences.map(function (f) { return esc(fenceName(f)); }).join(', ') : '<strong style="color:#d62c2c">Outside all fences</strong>';
    return '<strong>' + esc(id) + '</strong>' + (d.herd ? ' · herd ' + esc(d.herd) : '') + '<br>' + where +
      '<br>Last seen ' + esc(ago(d.ts)) + (d.battery != null ? '<br>Battery ' + d.battery + '%' : '');
  }

  function renderDevices() {
    var ids = Array.from(state.devices.keys());
    // animals outside first (they need attention), then by name
    ids.sort(function (a, b) {
      var da = state.devices.get(a), db = state.devices.get(b);
      if (da.inside !== db.inside) return da.inside ? 1 : -1;
      return a.localeCompare(b, undefined, { numeric: true });
    });
    var out = ids.filter(function (id) { return !state.devices.get(id).inside; }).length;
    $('herd-count').textContent = ids.length;
    $('device-empty').hidden = ids.length > 0;
    $('herd-summary').innerHTML = ids.length ? '<strong>' + (ids.length - out) + '</strong> inside a fence · <strong style="color:#d62c2c">' + out + '</strong> outside' : '';
    patchList($('device-list'), ids.map(function (id) {
      var d = state.devices.get(id);
      var st = d.inside ? 'inside' : 'outside';
      var where = (d.inside ? 'In ' + d.fences.map(fenceName).join(', ') : 'Outside all fences') + (d.herd ? ' · herd ' + d.herd : '');
      var batt = d.battery == null ? '<span class="battery">battery —</span>' :
        '<span class="battery' + (d.battery < 20 ? ' is-low' : '') + '" title="Battery ' + d.battery + '%">' +
        '<span class="battery-bar" aria-hidden="true"><span class="battery-fill" style="width:' + d.battery + '%"></span></span>' + d.battery + '%</span>';
      return '<li class="device-item' + (d.quiet ? ' is-quiet' : '') + '" data-device-id="' + esc(id) + '" data-state="' + st + '" data-testid="device-item" tabindex="0" role="button" aria-label="' + esc(id + ', ' + where + ', last seen ' + ago(d.ts) + (d.battery != null ? ', battery ' + d.battery + ' percent' : '')) + '">' +
        '<span class="state-dot" data-state="' + st + '" aria-hidden="true"></span>' +
        '<div class="device-main"><div class="device-name">' + esc(id) + '</div>' +
        '<div class="device-where' + (d.inside ? '' : ' is-out') + '">' + esc(where) + '</div></div>' +
        '<div class="device-side"><div class="last-seen" title="' + esc(d.ts ? d.ts.toISOString() : '') + '">' + esc(ago(d.ts)) + '</div>' + batt + '</div></li>';
    }));
  }

  function focusDevice(id) {
    var d = state.devices.get(id);
    if (!d) return;
    map.setView(d.marker.getLatLng(), Math.max(map.getZoom(), 16));
    d.marker.openPopup();
  }

  function maybeFitOnce() {
    if (state.fittedOnce) return;
    state.fittedOnce = true;
    if (localStorage.getItem(LS_VIEW)) return; // respect the farmer's last view
    fitAll();
  }

  function fitAll() {
    var b = L.latLngBounds([]);
    state.fences.forEach(function (e) { b.extend(e.layer.getBounds()); });
    state.devices.forEach(function (d) { b.extend(d.marker.getLatLng()); });
    if (b.isValid()) map.fitBounds(b, { padding: [30, 30], maxZoom: 17 });
  }

  // ---------------------------------------------------------------- events / alerts
  function eventKey(e) {
    return e.event_id != null ? String(e.event_id) : [e.type, e.device_id, e.fence_id, e.ts].join('|');
  }

  function addEvents(list, live) {
    var fresh = [];
    list.forEach(function (e) {
      if (!e || !e.type) return;
      var k = eventKey(e);
      if (state.eventIds.has(k)) return;
      state.eventIds.add(k);
      e._key = k; e._date = parseTs(e.ts) || new Date();
      state.events.push(e);
      fresh.push(e);
    });
    if (!fresh.length) return;
    state.events.sort(function (a, b) { return a._date - b._date; });
    if (state.events.length > MAX_ALERTS) {
      state.events.splice(0, state.events.length - MAX_ALERTS).forEach(function (e) { state.eventIds.delete(e._key); });
    }
    if (live) {
      fresh.forEach(function (e) { e._new = true; });
      var exits = fresh.filter(function (e) { return String(e.type).toLowerCase() === 'exit'; });
      if (exits.length) {
        if (state.activeTab !== 'alerts') state.unseenExits += exits.length;
        var last = exits[exits.length - 1];
        alarm(last);
      }
    }
    renderAlerts();
    if (live) fresh.forEach(function (e) { setTimeout(function () { e._new = false; }, 2500); });
  }

  function eventText(e) {
    var t = String(e.type).toLowerCase();
    var who = e.device_id || 'An animal', where = e.fence_id != null ? fenceName(String(e.fence_id)) : 'a fence';
    if (t === 'exit') return who + ' left ' + where;
    if (t === 'enter') return who + ' entered ' + where;
    if (t === 'dwell') return who + ' is staying in ' + where;
    if (t === 'silent') return who + ' has gone quiet' + (e.fence_id != null ? ' (last in ' + where + ')' : '');
    return who + ': ' + t + ' ' + where;
  }
  var ICONS = { enter: '↘', exit: '!', dwell: '⏱', silent: '…' };

  function renderAlerts() {
    var items = state.events.slice().reverse();
    $('alerts-empty').hidden = items.length > 0;
    var badge = $('alert-count');
    badge.hidden = state.unseenExits === 0;
    badge.textContent = state.unseenExits;
    patchList($('alerts'), items.map(function (e) {
      var t = String(e.type).toLowerCase();
      return '<li data-type="' + esc(t) + '" data-event-id="' + esc(e._key) + '" data-device-id="' + esc(e.device_id) + '" data-fence-id="' + esc(e.fence_id) + '" data-testid="alert-item"' + (e._new ? ' class="is-new"' : '') + '>' +
        '<span class="alert-icon" aria-hidden="true">' + (ICONS[t] || '•') + '</span>' +
        '<div class="alert-text"><div class="alert-title">' + esc(eventText(e)) + '</div>' +
        '<div class="alert-time"><time datetime="' + esc(e._date.toISOString()) + '">' + esc(clock(e._date)) + '</time> · ' + esc(t.toUpperCase()) + '</div></div></li>';
    }));
  }

  function alarm(e) {
    var flash = $('flash');
    flash.classList.remove('active');
    void flash.offsetWidth; // restart the animation
    flash.classList.add('active');
    document.body.setAttribute('data-last-exit', e._key);
    announce(eventText(e), 'exit', 6000);
    beep();
    var d = state.devices.get(String(e.device_id));
    if (d) { d.marker.setZIndexOffset(1000); }
  }

  var toastTimer = null;
  function announce(text, type, ms) {
    var t = $('toast');
    t.textContent = text;
    t.setAttribute('data-type', type || 'info');
    t.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(function () { t.hidden = true; }, ms || 2500);
  }

  function ensureAudio() {
    try {
      var Ctx = window.AudioContext || window.webkitAudioContext;
      if (!Ctx) return null;
      if (!state.audio) state.audio = new Ctx();
      if (state.audio.state === 'suspended') state.audio.resume();
      return state.audio;
    } catch (e) { return null; }
  }

  function beep() {
    if (!state.sound) return;
    var ctx = ensureAudio();
    if (!ctx) return;
    try {
      var now = ctx.currentTime;
      [0, 0.22].forEach(function (offset) {
        var osc = ctx.createOscillator(), gain = ctx.createGain();
        osc.type = 'square';
        osc.frequency.setValueAtTime(880, now + offset);
        gain.gain.setValueAtTime(0.0001, now + offset);
        gain.gain.exponentialRampToValueAtTime(0.15, now + offset + 0.02);
        gain.gain.exponentialRampToValueAtTime(0.0001, now + offset + 0.18);
        osc.connect(gain).connect(ctx.destination);
        osc.start(now + offset);
        osc.stop(now + offset + 0.2);
      });
    } catch (err) { /* audio is a nice-to-have */ }
  }

  function loadEvents(live) {
    return api('GET', '/v1/events?limit=50').then(function (res) {
      var list = (res && res.events) || (Array.isArray(res) ? res : []);
      addEvents(list, live);
    }).catch(function (err) { handleApiFailure(err, 'Loading alerts'); });
  }

  var ES_TYPES = ['fence', 'enter', 'exit', 'dwell', 'silent', 'event', 'fence_event']; // the API sends `event: fence`
  function openStream() {
    closeStream();
    if (!window.EventSource) return;
    // EventSource cannot send an Authorization header: a short-lived stream token goes in the URL,
    // never the farm key (which would land in access logs)
    var key = state.key;
    api('POST', '/v1/events/stream-token').then(function (t) {
      if (state.key === key && t && t.token) listen(new EventSource('/v1/events/stream?token=' + encodeURIComponent(t.token)));
    }).catch(function () {
      setTimeout(function () { if (state.key === key) openStream(); }, 5000);
    });
  }
  function listen(es) {
    closeStream();
    state.es = es;
    var onData = function (msg) {
      if (!msg.data) return;
      var e;
      try { e = JSON.parse(msg.data); } catch (err) { return; }
      state.sseEvents++;
      if (Array.isArray(e)) addEvents(e, true);
      else if (e && e.events) addEvents(e.events, true);
      else addEvents([e], true);
      refreshSoon();
    };
    es.onmessage = onData;
    ES_TYPES.forEach(function (t) { es.addEventListener(t, onData); });
    es.onopen = function () { state.esLive = true; setConnected(true); };
    es.onerror = function () {
      state.esLive = false; setConnected(null);
      if (es.readyState === EventSource.CLOSED && state.es === es) {
        setTimeout(function () { if (state.es === es && state.key) openStream(); }, 5000);
      }
    };
  }
  function closeStream() {
    if (state.es) { try { state.es.close(); } catch (e) { /* ignore */ } }
    state.es = null; state.esLive = false;
  }

  var connState = null;
  function setConnected(ok) {
    var el = $('conn-status');
    var s, text;
    if (ok === false) { s = 'offline'; text = 'Server unreachable'; }
    else if (state.esLive) { s = 'live'; text = 'Live'; }
    else { s = 'polling'; text = 'Updating every few seconds'; }
    if (connState === s) return;
    connState = s;
    el.setAttribute('data-state', s);
    el.querySelector('.conn-text').textContent = text;
  }

  // ---------------------------------------------------------------- tabs
  function selectTab(name) {
    state.activeTab = name;
    document.querySelectorAll('.tabs [role="tab"]').forEach(function (tab) {
      var on = tab.dataset.tab === name;
      tab.setAttribute('aria-selected', on ? 'true' : 'false');
      tab.tabIndex = on ? 0 : -1;
      $('panel-' + tab.dataset.tab).hidden = !on;
    });
    if (name === 'alerts') { state.unseenExits = 0; renderAlerts(); }
  }

  function onTabKey(ev) {
    var tabs = Array.from(document.querySelectorAll('.tabs [role="tab"]'));
    var i = tabs.indexOf(document.activeElement);
    if (i < 0) return;
    var j = ev.key === 'ArrowRight' ? (i + 1) % tabs.length : ev.key === 'ArrowLeft' ? (i + tabs.length - 1) % tabs.length : -1;
    if (j < 0) return;
    ev.preventDefault();
    tabs[j].focus();
    selectTab(tabs[j].dataset.tab);
  }

  // ---------------------------------------------------------------- session
  function startSession() {
    $('login-view').hidden = true;
    $('app').hidden = false;
    if (!map) initMap(); else map.invalidateSize();
    setTimeout(function () { map.invalidateSize(); }, 50);
    clearError();
    state.fittedOnce = false;
    Promise.all([loadFences().catch(function (err) { handleApiFailure(err, 'Loading fences'); }), loadEvents(false)])
      .then(function () { return loadPositions(); });
    openStream();
    state.timers.push(setInterval(loadPositions, POS_POLL_MS));
    var lastEventsPoll = Date.now();
    state.timers.push(setInterval(function () {
      var every = state.esLive ? EVENTS_POLL_LIVE_MS : EVENTS_POLL_DOWN_MS;
      if (Date.now() - lastEventsPoll >= every) { lastEventsPoll = Date.now(); loadEvents(true); }
    }, 1000));
    state.timers.push(setInterval(function () { if (!state.editing) loadFences().catch(function () {}); }, 30000));
    state.timers.push(setInterval(renderDevicesIfVisible, 10000));
  }

  function renderDevicesIfVisible() { if (state.activeTab === 'herd') renderDevices(); }

  function signOut(message) {
    state.generation++;
    closeStream();
    state.timers.forEach(clearInterval); state.timers = [];
    state.key = null;
    localStorage.removeItem(LS_KEY);
    discardPending();
    if ($('fence-dialog').open) $('fence-dialog').close();
    if (map) {
      if (state.editing) { var e = state.fences.get(state.editing); if (e) e.layer.pm.disable(); }
      map.pm.disableDraw();
      fenceGroup.clearLayers(); herdGroup.clearLayers(); trailGroup.clearLayers();
    }
    state.fences.clear(); state.devices.clear(); state.events = []; state.eventIds.clear();
    state.editing = state.renaming = state.confirmingDelete = null; state.unseenExits = 0;
    connState = null;
    renderFences(); renderDevices(); renderAlerts();
    $('app').hidden = true;
    $('login-view').hidden = false;
    $('login-error').textContent = message || '';
    $('login-key').value = '';
    $('login-btn').disabled = false;
    $('login-key').focus();
  }

  function tryLogin(key, fromStorage) {
    $('login-btn').disabled = true;
    $('login-error').textContent = '';
    return api('GET', '/v1/fences', undefined, key).then(function () {
      state.key = key;
      localStorage.setItem(LS_KEY, key);
      $('login-btn').disabled = false;
      startSession();
    }).catch(function (err) {
      $('login-btn').disabled = false;
      $('login-view').hidden = false;
      $('app').hidden = true;
      if (err.status === 403) {
        $('login-error').textContent = 'This is not a farm key: ' + err.message;
      } else if (err.status === 401) {
        localStorage.removeItem(LS_KEY);
        $('login-error').textContent = fromStorage ? 'Your saved farm key is no longer valid. Please sign in again.' : 'That farm key was not accepted. Check it and try again.';
      } else {
        if (fromStorage) $('login-key').value = key;
        $('login-error').textContent = describeError(err, 'Signing in');
      }
    });
  }

  // ---------------------------------------------------------------- settings
  function openSettings() {
    var v = localStorage.getItem(LS_TILES);
    $('tile-url').value = v === null ? DEFAULT_TILES : v;
    $('settings-dialog').showModal();
  }

  // ---------------------------------------------------------------- wiring
  function wire() {
    $('login-form').addEventListener('submit', function (ev) {
      ev.preventDefault();
      var key = $('login-key').value.trim();
      if (!key) { $('login-error').textContent = 'Please paste your farm API key.'; $('login-key').focus(); return; }
      ensureAudio(); // unlock WebAudio with this user gesture so EXIT beeps can play later
      tryLogin(key, false);
    });
    $('logout-btn').addEventListener('click', function () { signOut(''); });
    $('error-close').addEventListener('click', clearError);

    $('sound-btn').setAttribute('aria-pressed', state.sound ? 'true' : 'false');
    $('sound-btn').setAttribute('aria-label', state.sound ? 'Alert sound on' : 'Alert sound off');
    $('sound-btn').addEventListener('click', function () {
      state.sound = !state.sound;
      localStorage.setItem(LS_SOUND, state.sound ? 'on' : 'off');
      this.setAttribute('aria-pressed', state.sound ? 'true' : 'false');
      this.setAttribute('aria-label', state.sound ? 'Alert sound on' : 'Alert sound off');
      if (state.sound) { ensureAudio(); beep(); }
    });

    $('settings-btn').addEventListener('click', openSettings);
    $('settings-cancel').addEventListener('click', function () { $('settings-dialog').close(); });
    $('tile-default').addEventListener('click', function () { $('tile-url').value = DEFAULT_TILES; });
    $('tile-none').addEventListener('click', function () { $('tile-url').value = ''; });
    $('settings-form').addEventListener('submit', function (ev) {
      ev.preventDefault();
      var url = $('tile-url').value.trim();
      localStorage.setItem(LS_TILES, url);
      if (map) setTiles(url);
      $('settings-dialog').close();
    });

    document.querySelector('.tabs').addEventListener('click', function (ev) {
      var tab = ev.target.closest('[role="tab"]');
      if (tab) selectTab(tab.dataset.tab);
    });
    document.querySelector('.tabs').addEventListener('keydown', onTabKey);

    $('draw-fence-btn').addEventListener('click', function () {
      if (state.editing) cancelEdit(state.editing);
      map.pm.enableDraw('Polygon', { allowSelfIntersection: false, snappable: true });
      if (window.matchMedia('(max-width: 899px)').matches) $('map').scrollIntoView({ block: 'start' });
    });
    $('draw-cancel').addEventListener('click', function () { map.pm.disableDraw(); });
    $('fit-btn').addEventListener('click', fitAll);

    $('fence-form').addEventListener('submit', savePendingFence);
    $('fence-cancel').addEventListener('click', function () { discardPending(); $('fence-dialog').close('cancel'); });
    $('fence-dialog').addEventListener('cancel', function () { discardPending(); });
    $('fence-dialog').addEventListener('close', function () { if ($('fence-dialog').returnValue !== 'saved') discardPending(); });

    $('fence-list').addEventListener('click', onFenceListClick);
    $('fence-list').addEventListener('submit', onFenceListSubmit);
    $('fence-list').addEventListener('keydown', function (ev) {
      if (ev.key === 'Escape' && state.renaming) { state.renaming = null; renderFences(); }
    });

    var deviceActivate = function (ev) {
      var li = ev.target.closest('[data-device-id]');
      if (!li) return;
      if (ev.type === 'keydown' && ev.key !== 'Enter' && ev.key !== ' ') return;
      if (ev.type === 'keydown') ev.preventDefault();
      focusDevice(li.dataset.deviceId);
    };
    $('device-list').addEventListener('click', deviceActivate);
    $('device-list').addEventListener('keydown', deviceActivate);
    $('alerts').addEventListener('click', function (ev) {
      var li = ev.target.closest('[data-device-id]');
      if (li) focusDevice(li.dataset.deviceId);
    });

    document.addEventListener('keydown', function (ev) {
      if (ev.key === 'Escape' && map && map.pm.globalDrawModeEnabled && map.pm.globalDrawModeEnabled()) map.pm.disableDraw();
    });
    document.addEventListener('visibilitychange', function () {
      if (!document.hidden && state.key) { loadPositions(); loadEvents(true); }
    });
  }

  function boot() {
    wire();
    // for tests / troubleshooting
    window.herdfence = { state: state, get map() { return map; }, reload: function () { loadFences(); loadPositions(); loadEvents(true); } };
    var saved = localStorage.getItem(LS_KEY);
    if (saved) {
      $('login-view').hidden = false; $('app').hidden = true;
      tryLogin(saved, true);
    } else {
      $('login-view').hidden = false;
      $('login-key').focus();
    }
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', boot); else boot();
})();
