// The trace browser's shell: hash router, top bar, live polling.
//
// The URL hash is the whole state (a reload shows the same view). Each view module exports
// `mount(ctx)` and returns {update(route)?, status(st, prev)?, destroy()?}; a hash change that
// keeps the same view key (same view, run, episode...) is handed to `update` instead of
// rebuilding the view, so filters and node deep links do not flash the page.

import {api, clearError, showError} from './api.js';
import {fmtInt, h, hashOf, replace} from './dom.js';
import * as runsView from './runs.js';
import * as listView from './list.js';
import * as metricsView from './metrics.js';
import * as episodeView from './episode.js';
import * as compareView from './compare.js';

const VIEWS = {
  runs: runsView,
  list: listView,
  metrics: metricsView,
  episode: episodeView,
  group: compareView,
  diff: compareView,
};
const POLL_MS = 2000;
const root = document.documentElement;

/** The route of a hash: {view, run, ...}; null when the hash names no view. */
export function parseHash(hash) {
  let text = hash.startsWith('#') ? hash.slice(1) : hash;
  let search = '';
  const q = text.indexOf('?');
  if (q >= 0) {
    search = text.slice(q + 1);
    text = text.slice(0, q);
  }
  const query = Object.fromEntries(new URLSearchParams(search));
  let parts;
  try {
    parts = text.split('/').filter((p) => p !== '').map(decodeURIComponent);
  } catch {
    return null;
  }
  const int = (v) => (/^\d+$/.test(v) ? Number(v) : null);
  if (parts.length === 0) return {view: 'runs', query, key: 'runs'};
  if (parts[0] !== 'run' || parts.length < 2) return null;
  const run = parts[1];
  const rest = parts.slice(2);
  const base = {run, query};
  if (rest.length === 0) return {...base, view: 'list', key: `list\0${run}`};
  if (rest[0] === 'metrics' && rest.length === 1) return {...base, view: 'metrics', key: `metrics\0${run}`};
  if (rest[0] === 'episode' && int(rest[1]) !== null) {
    const line = int(rest[1]);
    const route = {...base, view: 'episode', line, key: `episode\0${run}\0${line}`, trace: null, node: null};
    if (rest.length === 2) return route;
    if (rest.length === 6 && rest[2] === 'trace' && rest[4] === 'node' &&
        int(rest[3]) !== null && int(rest[5]) !== null) {
      return {...route, trace: int(rest[3]), node: int(rest[5])};
    }
    return null;
  }
  if (rest[0] === 'group' && rest.length === 2) {
    return {...base, view: 'group', group: rest[1], key: `group\0${run}\0${rest[1]}`};
  }
  if (rest[0] === 'diff' && rest.length === 3 && int(rest[1]) !== null && int(rest[2]) !== null) {
    const a = int(rest[1]);
    const b = int(rest[2]);
    return {...base, view: 'diff', a, b, key: `diff\0${run}\0${a}\0${b}`};
  }
  return null;
}

/** Go to a hash (a new history entry); `replace` rewrites the current one. */
export function navigate(hash, {replace: rewrite = false} = {}) {
  if (hash === location.hash || (hash === '#/' && location.hash === '')) return;
  root.dataset.ready = '0';
  if (rewrite) location.replace(hash);
  else location.hash = hash;
}

// ---- the top bar ----

const bar = {
  brand: document.getElementById('brand'),
  run: document.getElementById('bar-run'),
  nav: document.getElementById('bar-nav'),
  crumb: document.getElementById('bar-crumb'),
  live: document.getElementById('bar-live'),
};

function renderBar(route) {
  const run = route && route.run;
  replace(bar.run, run ? h('a', {href: hashOf(['run', run]), class: 'run-name', title: run}, run) : null);
  if (run) {
    const link = (label, hash, active) =>
      h('a', {href: hash, class: active ? 'active' : null, 'aria-current': active ? 'page' : null}, label);
    replace(bar.nav,
      link('Episodes', hashOf(['run', run]), route.view === 'list'),
      link('Metrics', hashOf(['run', run, 'metrics']), route.view === 'metrics'));
  } else {
    replace(bar.nav);
  }
  let crumb = null;
  if (route && route.view === 'episode') crumb = `episode ${route.line}`;
  if (route && route.view === 'group') crumb = `group ${route.group}`;
  if (route && route.view === 'diff') crumb = `diff ${route.a} ↔ ${route.b}`;
  replace(bar.crumb, crumb);
  bar.crumb.hidden = !crumb;
  const title = ['nodewise traces', run, crumb].filter(Boolean).join(' · ');
  document.title = title;
}

// ---- live status ----

const live = {run: null, last: null, fresh: 0, busy: false};

function renderLive() {
  if (!live.run || !live.last) {
    replace(bar.live);
    return;
  }
  const parts = [h('span', {class: 'live-count', title: 'episodes in the run'}, `${fmtInt(live.last.episodes)} episodes`)];
  if (live.fresh > 0) {
    parts.push(h('button', {
      type: 'button', class: 'new-badge', 'data-test': 'new', title: 'new episodes since you looked; click to clear',
      on: {click: () => { live.fresh = 0; renderLive(); }},
    }, `${fmtInt(live.fresh)} new`));
  }
  replace(bar.live, ...parts);
}

async function poll() {
  const run = live.run;
  if (!run || live.busy || document.visibilityState !== 'visible') return;
  live.busy = true;
  try {
    const st = await api.status(run);
    if (run !== live.run) return;
    const prev = live.last;
    live.last = st;
    if (prev && st.episodes > prev.episodes) live.fresh += st.episodes - prev.episodes;
    renderLive();
    if (prev && current.view && current.view.status &&
        (st.episodes !== prev.episodes || st.metrics !== prev.metrics)) {
      current.view.status(st, prev);
    }
  } catch (err) {
    // A run the server does not know stops the polling; a gone server is worth a banner.
    if (run === live.run && err.status >= 400 && err.status < 500) live.run = null;
    if (err.code === 'network') showError(err, 'live status');
  } finally {
    live.busy = false;
  }
}

// ---- routing ----

const main = document.getElementById('view');
const current = {route: null, view: null, ctx: null};

function makeCtx(route) {
  const controller = new AbortController();
  const ctx = {
    route,
    run: route.run,
    root: main,
    signal: controller.signal,
    abort: () => controller.abort(),
    navigate,
    setReady(ready) {
      if (current.ctx === ctx) root.dataset.ready = ready ? '1' : '0';
    },
    /** Rewrite the hash without a hashchange (e.g. the open node), for reloads and links. */
    setHash(hash) {
      if (current.ctx !== ctx || hash === location.hash) return;
      history.replaceState(history.state, '', hash);
      const next = parseHash(hash);
      if (next && next.key === current.route.key) {
        current.route = next;
        ctx.route = next;
        renderBar(next);
      }
    },
    fail(err, context) {
      showError(err, context);
      if (current.ctx === ctx) root.dataset.ready = '1';
    },
    isCurrent: () => current.ctx === ctx,
  };
  return ctx;
}

function route() {
  const r = parseHash(location.hash);
  clearError();
  if (!r) {
    teardown();
    root.dataset.view = 'runs';
    renderBar(null);
    replace(main, h('div', {class: 'empty'}, 'No such page. ', h('a', {href: '#/'}, 'All runs')));
    showError(new Error(`unknown address ${location.hash}`));
    root.dataset.ready = '1';
    return;
  }
  renderBar(r);
  if (r.run !== live.run) {
    live.run = r.run || null;
    live.last = null;
    live.fresh = 0;
    renderLive();
    if (live.run) poll();
  }
  if (current.route && current.route.key === r.key && current.view && current.view.update) {
    root.dataset.view = r.view;
    current.route = r;
    current.ctx.route = r;
    root.dataset.ready = '0';
    try {
      current.view.update(r);
    } catch (err) {
      current.ctx.fail(err, r.view);
    }
    return;
  }
  teardown();
  root.dataset.view = r.view;
  root.dataset.ready = '0';
  main.replaceChildren();
  main.className = `view view-${r.view}`;
  window.scrollTo(0, 0);
  const ctx = makeCtx(r);
  current.route = r;
  current.ctx = ctx;
  try {
    current.view = VIEWS[r.view].mount(ctx) || {};
  } catch (err) {
    current.view = {};
    ctx.fail(err, r.view);
  }
}

function teardown() {
  if (current.view && current.view.destroy) {
    try {
      current.view.destroy();
    } catch (err) {
      console.warn(err);
    }
  }
  if (current.ctx) current.ctx.abort();
  current.route = null;
  current.view = null;
  current.ctx = null;
}

window.addEventListener('hashchange', route);
document.addEventListener('visibilitychange', () => {
  if (document.visibilityState === 'visible') poll();
});
setInterval(poll, POLL_MS);
window.addEventListener('unhandledrejection', (ev) => {
  if (ev.reason && ev.reason.name === 'AbortError') {
    ev.preventDefault();
    return;
  }
  showError(ev.reason, 'unexpected');
});
route();
