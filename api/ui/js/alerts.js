// Fence events: the Alerts tab, the live stream (SSE) with polling as a safety net, and the EXIT alarm
// (flash, toast, beep). APPROACH warnings are shown like EXIT alerts but quieter: amber, a short toast,
// no flash and no beep. Events the job inferred between sparse fixes or learnt from a late upload say so.
import { state, $ } from './state.js';
import { api } from './api.js';
import { handleApiFailure, announce } from './notify.js';
import { esc, parseTs, clock, patchList } from './util.js';
import { fenceName } from './fences.js';
import { refreshSoon } from './herd.js';

const MAX_ALERTS = 200;
const ICONS = { enter: '↘', exit: '!', approach: '⚠', dwell: '⏱', silent: '…' };
const ES_TYPES = ['fence', 'enter', 'exit', 'approach', 'dwell', 'silent', 'event', 'fence_event']; // the API sends `event: fence`

const eventKey = (e) => (e.event_id != null ? String(e.event_id) : [e.type, e.device_id, e.fence_id, e.ts].join('|'));
const typeOf = (e) => String(e.type).toLowerCase();

export function addEvents(list, live) {
  const fresh = [];
  for (const e of list) {
    if (!e || !e.type) continue;
    const k = eventKey(e);
    if (state.eventIds.has(k)) continue;
    state.eventIds.add(k);
    e._key = k; e._date = parseTs(e.ts) || new Date();
    state.events.push(e);
    fresh.push(e);
  }
  if (!fresh.length) return;
  state.events.sort((a, b) => a._date - b._date);
  if (state.events.length > MAX_ALERTS) {
    state.events.splice(0, state.events.length - MAX_ALERTS).forEach((e) => state.eventIds.delete(e._key));
  }
  if (live) {
    fresh.forEach((e) => { e._new = true; });
    const exits = fresh.filter((e) => typeOf(e) === 'exit');
    const approaches = fresh.filter((e) => typeOf(e) === 'approach');
    if (state.activeTab !== 'alerts') state.unseenExits += exits.length + approaches.length;
    if (exits.length) alarm(exits[exits.length - 1]);
    else if (approaches.length) announce(eventText(approaches[approaches.length - 1]), 'approach', 4000);
  }
  renderAlerts();
  if (live) fresh.forEach((e) => setTimeout(() => { e._new = false; }, 2500));
}

export function eventText(e) {
  const t = typeOf(e);
  const who = e.device_id || 'An animal', where = e.fence_id != null ? fenceName(String(e.fence_id)) : 'a fence';
  if (t === 'exit') return who + ' left ' + where;
  if (t === 'enter') return who + ' entered ' + where;
  if (t === 'approach') return who + ' is near the edge of ' + where;
  if (t === 'dwell') return who + ' is staying in ' + where;
  if (t === 'silent') return who + ' has gone quiet' + (e.fence_id != null ? ' (last in ' + where + ')' : '');
  return who + ': ' + t + ' ' + where;
}

export function renderAlerts() {
  const items = state.events.slice().reverse();
  $('alerts-empty').hidden = items.length > 0;
  const badge = $('alert-count');
  badge.hidden = state.unseenExits === 0;
  badge.textContent = state.unseenExits;
  patchList($('alerts'), items.map((e) => {
    const t = typeOf(e);
    const tags = (e.inferred ? '<span class="tag tag--inferred" title="Between two sparse fixes: the time is estimated">inferred</span>' : '') +
      (e.late ? '<span class="tag tag--late" title="From positions the collar uploaded late">late upload</span>' : '');
    return '<li data-type="' + esc(t) + '" data-event-id="' + esc(e._key) + '" data-device-id="' + esc(e.device_id) + '" data-fence-id="' + esc(e.fence_id) + '"' +
      (e.inferred ? ' data-inferred="true"' : '') + (e.late ? ' data-late="true"' : '') + ' data-testid="alert-item"' + (e._new ? ' class="is-new"' : '') + '>' +
      '<span class="alert-icon" aria-hidden="true">' + (ICONS[t] || '•') + '</span>' +
      '<div class="alert-text"><div class="alert-title">' + esc(eventText(e)) + '</div>' +
      '<div class="alert-time"><time datetime="' + esc(e._date.toISOString()) + '">' + esc(clock(e._date)) + '</time> · ' + esc(t.toUpperCase()) + tags + '</div></div></li>';
  }));
}

function alarm(e) {
  const flash = $('flash');
  flash.classList.remove('active');
  void flash.offsetWidth; // restart the animation
  flash.classList.add('active');
  document.body.setAttribute('data-last-exit', e._key);
  announce(eventText(e), 'exit', 6000);
  beep();
  const d = state.devices.get(String(e.device_id));
  if (d) d.marker.setZIndexOffset(1000);
}

export function ensureAudio() {
  try {
    const Ctx = window.AudioContext || window.webkitAudioContext;
    if (!Ctx) return null;
    if (!state.audio) state.audio = new Ctx();
    if (state.audio.state === 'suspended') state.audio.resume();
    return state.audio;
  } catch { return null; }
}

export function beep() {
  if (!state.sound) return;
  const ctx = ensureAudio();
  if (!ctx) return;
  try {
    const now = ctx.currentTime;
    for (const offset of [0, 0.22]) {
      const osc = ctx.createOscillator(), gain = ctx.createGain();
      osc.type = 'square';
      osc.frequency.setValueAtTime(880, now + offset);
      gain.gain.setValueAtTime(0.0001, now + offset);
      gain.gain.exponentialRampToValueAtTime(0.15, now + offset + 0.02);
      gain.gain.exponentialRampToValueAtTime(0.0001, now + offset + 0.18);
      osc.connect(gain).connect(ctx.destination);
      osc.start(now + offset);
      osc.stop(now + offset + 0.2);
    }
  } catch { /* audio is a nice-to-have */ }
}

export async function loadEvents(live) {
  try {
    const res = await api('GET', '/v1/events?limit=50');
    addEvents((res && res.events) || (Array.isArray(res) ? res : []), live);
  } catch (err) { handleApiFailure(err, 'Loading alerts'); }
}

// EventSource cannot send an Authorization header: a short-lived stream token goes in the URL, never
// the farm key (which would land in access logs).
export function openStream() {
  closeStream();
  if (!window.EventSource) return;
  const key = state.key;
  api('POST', '/v1/events/stream-token').then((t) => {
    if (state.key === key && t && t.token) listen(new EventSource('/v1/events/stream?token=' + encodeURIComponent(t.token)));
  }).catch(() => setTimeout(() => { if (state.key === key) openStream(); }, 5000));
}

function listen(es) {
  closeStream();
  state.es = es;
  const onData = (msg) => {
    if (!msg.data) return;
    let e;
    try { e = JSON.parse(msg.data); } catch { return; }
    state.sseEvents++;
    if (Array.isArray(e)) addEvents(e, true);
    else if (e && e.events) addEvents(e.events, true);
    else addEvents([e], true);
    refreshSoon();
  };
  es.onmessage = onData;
  ES_TYPES.forEach((t) => es.addEventListener(t, onData));
  es.onopen = () => { state.esLive = true; setConnected(true); };
  es.onerror = () => {
    state.esLive = false; setConnected(null);
    if (es.readyState === EventSource.CLOSED && state.es === es) {
      setTimeout(() => { if (state.es === es && state.key) openStream(); }, 5000);
    }
  };
}

export function closeStream() {
  if (state.es) { try { state.es.close(); } catch { /* ignore */ } }
  state.es = null; state.esLive = false;
}

let connState = null;
export function resetConnection() { connState = null; }
export function setConnected(ok) {
  const el = $('conn-status');
  let s, text;
  if (ok === false) { s = 'offline'; text = 'Server unreachable'; } else if (state.esLive) { s = 'live'; text = 'Live'; } else { s = 'polling'; text = 'Updating every few seconds'; }
  if (connState === s) return;
  connState = s;
  el.setAttribute('data-state', s);
  el.querySelector('.conn-text').textContent = text;
}
