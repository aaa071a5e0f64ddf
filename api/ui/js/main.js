// herdfence web UI: sign-in, the session's timers and the page's wiring. Vanilla ES modules, no build
// step; talks only to the herdfence HTTP API (same origin). Leaflet draws the map, Geoman edits corners.
import { state, $, LS_KEY, LS_TILES, LS_SOUND } from './state.js';
import { api, describeError } from './api.js';
import { clearError, handleApiFailure, setUnauthorizedHandler } from './notify.js';
import { map, initMap, setTiles, fitAll, fenceGroup, herdGroup, trailGroup, DEFAULT_TILES } from './map.js';
import { isDrawing, stopDrawing, undoCorner, finishDrawing } from './draw.js';
import { restyleWindows } from './fence-layers.js';
import { loadFences, renderFences, beginDrawing, discardPending, savePendingFence,
  onFenceListClick, onFenceListSubmit, onFenceListKey } from './fences.js';
import { loadPositions, renderDevices, focusDevice, setHerdFilter } from './herd.js';
import { loadEvents, renderAlerts, openStream, closeStream, resetConnection, ensureAudio, beep } from './alerts.js';
import { selectTab, onTabKey, onTabChange } from './tabs.js';
import { loadTimeInPaddock } from './stats.js';

const POS_POLL_MS = 2500;
const EVENTS_POLL_LIVE_MS = 10000;   // safety net while the SSE stream is up
const EVENTS_POLL_DOWN_MS = 3000;    // when the SSE stream is down

function startSession() {
  $('login-view').hidden = true;
  $('app').hidden = false;
  if (!map) initMap(); else map.invalidateSize();
  setTimeout(() => map.invalidateSize(), 50);
  clearError();
  state.fittedOnce = false;
  Promise.all([loadFences().catch((err) => handleApiFailure(err, 'Loading fences')), loadEvents(false)])
    .then(() => loadPositions());
  openStream();
  state.timers.push(setInterval(loadPositions, POS_POLL_MS));
  let lastEventsPoll = Date.now();
  state.timers.push(setInterval(() => {
    const every = state.esLive ? EVENTS_POLL_LIVE_MS : EVENTS_POLL_DOWN_MS;
    if (Date.now() - lastEventsPoll >= every) { lastEventsPoll = Date.now(); loadEvents(true); }
  }, 1000));
  state.timers.push(setInterval(() => { if (!state.editing) loadFences().catch(() => {}); }, 30000));
  state.timers.push(setInterval(restyleWindows, 15000)); // a strip's window opens or closes
  state.timers.push(setInterval(() => { if (state.activeTab === 'herd') { renderDevices(); loadTimeInPaddock(); } }, 30000));
}

function signOut(message) {
  state.generation++;
  closeStream();
  state.timers.forEach(clearInterval); state.timers = [];
  state.key = null;
  localStorage.removeItem(LS_KEY);
  discardPending();
  if ($('fence-dialog').open) $('fence-dialog').close();
  if (map) {
    if (state.editing) { const e = state.fences.get(state.editing); if (e) e.layer.pm.disable(); }
    stopDrawing();
    fenceGroup.clearLayers(); herdGroup.clearLayers(); trailGroup.clearLayers();
  }
  state.fences.clear(); state.devices.clear(); state.events = []; state.eventIds.clear();
  state.editing = state.renaming = state.planning = state.confirmingDelete = null; state.unseenExits = 0;
  resetConnection();
  renderFences(); renderDevices(); renderAlerts();
  $('app').hidden = true;
  $('login-view').hidden = false;
  $('login-error').textContent = message || '';
  $('login-key').value = '';
  $('login-btn').disabled = false;
  $('login-key').focus();
}

async function tryLogin(key, fromStorage) {
  $('login-btn').disabled = true;
  $('login-error').textContent = '';
  try {
    await api('GET', '/v1/fences', undefined, key);
  } catch (err) {
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
    return;
  }
  state.key = key;
  localStorage.setItem(LS_KEY, key);
  $('login-btn').disabled = false;
  startSession();
}

function setSoundButton() {
  $('sound-btn').setAttribute('aria-pressed', state.sound ? 'true' : 'false');
  $('sound-btn').setAttribute('aria-label', state.sound ? 'Alert sound on' : 'Alert sound off');
}

function wire() {
  setUnauthorizedHandler(signOut);
  $('login-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const key = $('login-key').value.trim();
    if (!key) { $('login-error').textContent = 'Please paste your farm API key.'; $('login-key').focus(); return; }
    ensureAudio(); // unlock WebAudio with this user gesture so EXIT beeps can play later
    tryLogin(key, false);
  });
  $('logout-btn').addEventListener('click', () => signOut(''));
  $('error-close').addEventListener('click', clearError);

  setSoundButton();
  $('sound-btn').addEventListener('click', () => {
    state.sound = !state.sound;
    localStorage.setItem(LS_SOUND, state.sound ? 'on' : 'off');
    setSoundButton();
    if (state.sound) { ensureAudio(); beep(); }
  });

  $('settings-btn').addEventListener('click', () => {
    const v = localStorage.getItem(LS_TILES);
    $('tile-url').value = v === null ? DEFAULT_TILES : v;
    $('settings-dialog').showModal();
  });
  $('settings-cancel').addEventListener('click', () => $('settings-dialog').close());
  $('tile-default').addEventListener('click', () => { $('tile-url').value = DEFAULT_TILES; });
  $('tile-none').addEventListener('click', () => { $('tile-url').value = ''; });
  $('settings-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const url = $('tile-url').value.trim();
    localStorage.setItem(LS_TILES, url);
    if (map) setTiles(url);
    $('settings-dialog').close();
  });

  document.querySelector('.tabs').addEventListener('click', (ev) => {
    const tab = ev.target.closest('[role="tab"]');
    if (tab) selectTab(tab.dataset.tab);
  });
  document.querySelector('.tabs').addEventListener('keydown', onTabKey);
  onTabChange((name) => {
    if (name === 'alerts') { state.unseenExits = 0; renderAlerts(); }
    if (name === 'herd') loadTimeInPaddock();
  });

  $('draw-fence-btn').addEventListener('click', beginDrawing);
  $('draw-undo').addEventListener('click', undoCorner);
  $('draw-finish').addEventListener('click', finishDrawing);
  $('draw-cancel').addEventListener('click', stopDrawing);
  $('fit-btn').addEventListener('click', fitAll);

  $('fence-form').addEventListener('submit', savePendingFence);
  $('fence-cancel').addEventListener('click', () => { discardPending(); $('fence-dialog').close('cancel'); });
  $('fence-dialog').addEventListener('cancel', discardPending);
  $('fence-dialog').addEventListener('close', () => { if ($('fence-dialog').returnValue !== 'saved') discardPending(); });

  $('fence-list').addEventListener('click', onFenceListClick);
  $('fence-list').addEventListener('submit', onFenceListSubmit);
  $('fence-list').addEventListener('keydown', onFenceListKey);

  $('device-list').addEventListener('click', (ev) => {
    const li = ev.target.closest('[data-device-id]');
    if (li) focusDevice(li.dataset.deviceId);
  });
  $('herd-glance').addEventListener('click', (ev) => {
    const chip = ev.target.closest('[data-filter]');
    if (chip) setHerdFilter(chip.dataset.filter);
  });
  $('tip-period').addEventListener('change', loadTimeInPaddock);
  $('alerts').addEventListener('click', (ev) => {
    const li = ev.target.closest('[data-device-id]');
    if (li) focusDevice(li.dataset.deviceId);
  });

  document.addEventListener('visibilitychange', () => {
    if (!document.hidden && state.key) { loadPositions(); loadEvents(true); }
  });
}

function boot() {
  wire();
  // for tests / troubleshooting
  window.herdfence = { state, get map() { return map; }, get drawing() { return isDrawing(); },
    reload() { loadFences(); loadPositions(); loadEvents(true); } };
  const saved = localStorage.getItem(LS_KEY);
  $('login-view').hidden = false;
  if (saved) { $('app').hidden = true; tryLogin(saved, true); } else $('login-key').focus();
}

boot(); // modules run after the document is parsed
