// The herdfence HTTP API client: same origin, "Authorization: Bearer <farm key>", errors as ApiError.
import { state } from './state.js';

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function formatDetail(detail) {
  if (detail == null) return '';
  if (typeof detail === 'string') return detail;
  if (Array.isArray(detail)) {
    return detail.map((d) => {
      if (d && typeof d === 'object') {
        const loc = Array.isArray(d.loc) ? d.loc.filter((x) => x !== 'body').join('.') : '';
        return (loc ? loc + ': ' : '') + (d.msg || JSON.stringify(d));
      }
      return String(d);
    }).join('; ');
  }
  if (typeof detail === 'object') return detail.message || detail.msg || JSON.stringify(detail);
  return String(detail);
}

export async function api(method, path, body, keyOverride) {
  const key = keyOverride || state.key;
  const gen = state.generation;
  const opts = { method, headers: { Accept: 'application/json' } };
  if (key) opts.headers.Authorization = 'Bearer ' + key;
  if (body !== undefined) {
    opts.headers['Content-Type'] = 'application/json';
    opts.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, opts);
  } catch (err) {
    throw new ApiError(0, 'Cannot reach the herdfence server (' + ((err && err.message) || 'network error') + ')');
  }
  if (gen !== state.generation && !keyOverride) throw new ApiError(0, 'stale');
  if (res.status === 204) return null;
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!res.ok) {
    const msg = data && data.detail !== undefined ? formatDetail(data.detail) : (text || res.statusText);
    throw new ApiError(res.status, msg || ('HTTP ' + res.status));
  }
  return data;
}

export function describeError(err, what) {
  if (!err) return what + ' failed';
  return what + ' failed' + (err.status ? ' (' + err.status + ')' : '') + ': ' + err.message;
}
