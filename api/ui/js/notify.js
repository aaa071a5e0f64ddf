// What the farmer is told: the error banner, short toasts, and the hook that signs out on a 401.
import { $ } from './state.js';
import { describeError } from './api.js';

let onUnauthorized = () => {};
export function setUnauthorizedHandler(fn) { onUnauthorized = fn; }

export function showError(msg) {
  $('error-text').textContent = msg;
  $('error-banner').hidden = false;
}
export function clearError() { $('error-banner').hidden = true; $('error-text').textContent = ''; }

export function handleApiFailure(err, what) {
  if (err && err.message === 'stale') return;
  if (err && err.status === 401) { onUnauthorized('Your farm key was not accepted any more. Please sign in again.'); return; }
  showError(describeError(err, what));
}

let toastTimer = null;
export function announce(text, type, ms) {
  const t = $('toast');
  t.textContent = text;
  t.setAttribute('data-type', type || 'info');
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.hidden = true; }, ms || 2500);
}
