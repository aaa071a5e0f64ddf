// Shared state of the page and its settings. Every view module reads and writes this one object.
export const LS_KEY = 'herdfence.apiKey';
export const LS_TILES = 'herdfence.tileUrl';
export const LS_VIEW = 'herdfence.view';
export const LS_SOUND = 'herdfence.sound';
// a device silent this long is shown as "silent": the server's HERDFENCE_SILENT_SECONDS (the page's meta),
// the same threshold as its "silent" events, so a collar reporting every 15 minutes is not flagged
const silentMeta = document.querySelector('meta[name="herdfence-silent-seconds"]');
export const QUIET_MS = (Number(silentMeta && silentMeta.content) || 3600) * 1000;
export const LOW_BATTERY = 20;               // percent

export const state = {
  key: null,
  fences: new Map(),      // id -> {feature, layer, color}
  devices: new Map(),     // device_id -> {marker, trail, fences, inside, ts, quiet, battery, herd}
  events: [],             // sorted oldest -> newest
  eventIds: new Set(),
  editing: null,          // fence id whose shape is being edited
  renaming: null,         // fence id whose details (name, warning distance) are being edited
  planning: null,         // fence id whose strip plan form is open
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

export const $ = (id) => document.getElementById(id);
