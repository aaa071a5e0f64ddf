// The panel's tabs (Fences, Herd, Alerts): ARIA tabs with arrow-key navigation.
import { state, $ } from './state.js';

const listeners = [];
export function onTabChange(fn) { listeners.push(fn); }

export function selectTab(name) {
  state.activeTab = name;
  document.querySelectorAll('.tabs [role="tab"]').forEach((tab) => {
    const on = tab.dataset.tab === name;
    tab.setAttribute('aria-selected', on ? 'true' : 'false');
    tab.tabIndex = on ? 0 : -1;
    $('panel-' + tab.dataset.tab).hidden = !on;
  });
  listeners.forEach((fn) => fn(name));
}

export function onTabKey(ev) {
  const tabs = Array.from(document.querySelectorAll('.tabs [role="tab"]'));
  const i = tabs.indexOf(document.activeElement);
  if (i < 0) return;
  const j = ev.key === 'ArrowRight' ? (i + 1) % tabs.length : ev.key === 'ArrowLeft' ? (i + tabs.length - 1) % tabs.length : -1;
  if (j < 0) return;
  ev.preventDefault();
  tabs[j].focus();
  selectTab(tabs[j].dataset.tab);
}
