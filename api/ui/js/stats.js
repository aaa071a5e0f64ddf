// Time in paddock: a small bar chart per fence of how long each animal was inside over a chosen period
// (GET /v1/time-in-fence). Plain HTML bars: readable by screen readers, nothing for the CSP to allow.
import { state, $ } from './state.js';
import { api } from './api.js';
import { handleApiFailure } from './notify.js';
import { esc, duration } from './util.js';
import { fenceName } from './fences.js';

const PERIODS = { today: () => { const d = new Date(); d.setHours(0, 0, 0, 0); return d; },
  '24h': () => new Date(Date.now() - 24 * 3600e3), '7d': () => new Date(Date.now() - 7 * 24 * 3600e3) };

export async function loadTimeInPaddock() {
  if (!state.key) return;
  const from = (PERIODS[$('tip-period').value] || PERIODS['24h'])();
  const to = new Date();
  try {
    const res = await api('GET', '/v1/time-in-fence?from=' + encodeURIComponent(from.toISOString()) + '&to=' + encodeURIComponent(to.toISOString()));
    render(res);
  } catch (err) { handleApiFailure(err, 'Loading time in paddock'); }
}

function render(res) {
  const el = $('tip-chart');
  const items = (res && res.items) || [];
  if (!items.length) { el.innerHTML = '<p class="empty">No animal was inside a fence in this period.</p>'; return; }
  const total = Math.max(1, res.seconds);
  const byFence = new Map();
  for (const it of items) {
    if (!byFence.has(it.fence_id)) byFence.set(it.fence_id, []);
    byFence.get(it.fence_id).push(it);
  }
  el.innerHTML = Array.from(byFence.entries()).map(([fid, rows]) =>
    '<figure class="tip-fence" data-fence-id="' + esc(fid) + '"><figcaption>' + esc(fenceName(String(fid))) + '</figcaption><ul class="tip-bars">' +
    rows.map((r) => {
      const pct = Math.min(100, Math.round((r.seconds / total) * 100));
      return '<li data-device-id="' + esc(r.device_id) + '" data-seconds="' + r.seconds + '" data-testid="tip-row">' +
        '<span class="tip-who">' + esc(r.device_id) + '</span>' +
        '<span class="tip-track" aria-hidden="true"><span class="tip-fill" style="width:' + pct + '%"></span></span>' +
        '<span class="tip-val">' + esc(duration(r.seconds)) + (r.inside_now ? ' · inside' : '') + '</span></li>';
    }).join('') + '</ul></figure>').join('');
}
