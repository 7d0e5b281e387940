// `#/run/{run}?sort=..&step=..`: the episode list, virtualized.
//
// The scroll container holds a body as tall as every matched row; only the rows in view (and a
// margin) are in the DOM. Rows come from the API a page (offset/limit) at a time, fetched when
// they scroll into view and cached until the query changes, so 100,000 rows scroll as smoothly
// as 100.

import {api} from './api.js';
import {fmtBytes, fmtDuration, fmtInt, fmtNum, h, hashOf, replace, rewardHue} from './dom.js';

const ROW = 26; // px, one row (style.css: .ep-row height)
const PAGE = 200; // rows per request
const MARGIN = 12; // rows rendered above and below the view
const MAX_INFLIGHT = 3;
const MAX_PAGES = 300; // cached pages kept (60,000 rows)
const FILTER_KEYS = ['step', 'kind', 'env', 'errors', 'group', 'reward_min', 'reward_max', 'tokens_min', 'tokens_max'];

const COLUMNS = [
  {key: 'line', label: 'line', cls: 'num', fmt: (r) => String(r.line)},
  {key: 'step', label: 'step', cls: 'num', fmt: (r) => (r.step === null || r.step === undefined ? '—' : String(r.step))},
  {key: 'kind', label: 'kind', cls: 'kind', fmt: (r) => r.kind ?? '—'},
  {key: 'env', label: 'env', cls: 'text', fmt: (r) => r.env ?? '—'},
  {key: 'ok', label: 'ok', cls: 'ok', fmt: (r) => (r.ok === null || r.ok === undefined ? '—' : r.ok ? '✓' : '✗')},
  {key: 'reward', label: 'reward', cls: 'num'},
  {key: 'advantage', label: 'adv', cls: 'num', title: 'advantage', fmt: (r) => (typeof r.advantage === 'number' ? r.advantage.toFixed(4) : '—')},
  {key: 'tokens', label: 'tokens', cls: 'num', title: 'input + output tokens', fmt: (r) => fmtInt(r.tokens)},
  {key: 'turns', label: 'turns', cls: 'num', fmt: (r) => fmtInt(r.turns)},
  {key: 'errors', label: 'errors', cls: 'num', fmt: (r) => fmtInt(r.errors)},
  {key: 'duration', label: 'duration', cls: 'num', fmt: (r) => fmtDuration(r.duration)},
  {key: 'bytes', label: 'bytes', cls: 'num', fmt: (r) => fmtBytes(r.bytes)},
  {key: 'id', label: 'id', cls: 'mono text', fmt: (r) => r.id ?? '—'},
];

function filtersOf(query) {
  const out = {};
  for (const k of FILTER_KEYS) if (query[k] !== undefined && query[k] !== '') out[k] = query[k];
  return out;
}

export function mount(ctx) {
  const run = ctx.run;
  let query = {...ctx.route.query};
  let state = null; // the answer's matched/total/histogram/facets
  let pages = new Map(); // page index -> rows
  let stale = new Map(); // pages of before a live refresh, shown until fresh ones arrive
  const inflight = new Set();
  let gen = 0; // bumps on every query change or refresh: late answers are dropped
  let rafPending = false;
  let destroyed = false;
  const rendered = new Map(); // row index -> {el, row}
  let rewardRange = [0, 1];

  // ---- the skeleton ----
  const selects = {};
  const mkSelect = (name, label) => {
    const sel = h('select', {name, 'aria-label': label, on: {change: () => setFilter({[name]: sel.value})}});
    selects[name] = sel;
    return h('label', {class: 'ctl'}, h('span', null, label), sel);
  };
  const tokensMin = h('input', {type: 'number', name: 'tokens_min', min: 0, placeholder: 'min', inputmode: 'numeric',
    'aria-label': 'tokens at least', on: {change: () => setFilter({tokens_min: tokensMin.value})}});
  const tokensMax = h('input', {type: 'number', name: 'tokens_max', min: 0, placeholder: 'max', inputmode: 'numeric',
    'aria-label': 'tokens at most', on: {change: () => setFilter({tokens_max: tokensMax.value})}});
  const chips = h('span', {class: 'chips'});
  const matchedEl = h('span', {'data-test': 'matched', class: 'matched'}, '…');
  const totalEl = h('span', {class: 'muted'});
  const clearBtn = h('button', {type: 'button', class: 'link-btn', on: {click: () => ctx.navigate(hashOf(['run', run], query.sort ? {sort: query.sort} : null))}}, 'clear filters');
  const hist = h('div', {class: 'hist', 'data-test': 'histogram', role: 'group', 'aria-label': 'reward histogram'});
  const histAxis = h('div', {class: 'hist-axis'});

  const head = h('div', {class: 'ep-head', role: 'row'});
  const body = h('div', {class: 'ep-body', role: 'rowgroup'});
  const empty = h('div', {class: 'ep-empty', hidden: true}, 'No episodes match these filters.');
  const scroller = h('div', {class: 'ep-scroll', 'data-test': 'episode-list', role: 'table', 'aria-label': 'episodes', tabindex: 0},
    head, body, empty);

  ctx.root.append(h('section', {class: 'list'},
    h('div', {class: 'list-top'},
      h('div', {class: 'filters'},
        mkSelect('step', 'step'), mkSelect('kind', 'kind'), mkSelect('env', 'env'), mkSelect('errors', 'errors'),
        h('label', {class: 'ctl'}, h('span', null, 'tokens'), tokensMin, h('span', {class: 'dash'}, '–'), tokensMax),
        chips,
        h('div', {class: 'count'}, matchedEl, totalEl, clearBtn)),
      h('div', {class: 'hist-box'}, h('div', {class: 'hist-title'}, 'reward', h('span', {class: 'muted'}, ' · click a bar to filter')), hist, histAxis)),
    scroller));

  for (const c of COLUMNS) {
    head.append(h('div', {class: `cell ${c.cls} sortable`, role: 'columnheader', 'data-test': 'sort', 'data-column': c.key,
      title: `sort by ${c.title || c.label}`, tabindex: 0,
      on: {click: () => toggleSort(c.key), keydown: (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); toggleSort(c.key); } }}},
    c.label, h('span', {class: 'arrow'})));
  }
  head.append(h('div', {class: 'cell', role: 'columnheader'}, ''));

  // ---- state -> controls ----
  function syncControls() {
    const f = filtersOf(query);
    const facets = (state && state.facets) || {};
    const fill = (name, all, values, labels = null) => {
      const sel = selects[name];
      const want = f[name] ?? '';
      const opts = [h('option', {value: ''}, all)];
      const seen = new Set();
      for (const v of values || []) {
        const text = String(v);
        seen.add(text);
        opts.push(h('option', {value: text}, labels ? labels[text] ?? text : text));
      }
      if (want !== '' && !seen.has(want)) opts.push(h('option', {value: want}, labels ? labels[want] ?? want : want));
      replace(sel, opts);
      sel.value = want;
      sel.classList.toggle('set', want !== '');
    };
    fill('step', 'all steps', facets.steps);
    fill('kind', 'all kinds', facets.kinds);
    fill('env', 'all envs', facets.envs);
    fill('errors', 'any', ['yes', 'no'], {yes: 'with errors', no: 'without errors'});
    tokensMin.value = f.tokens_min ?? '';
    tokensMax.value = f.tokens_max ?? '';
    const chipOf = (label, keys) => h('span', {class: 'chip'}, label,
      h('button', {type: 'button', title: 'remove this filter', 'aria-label': 'remove filter',
        on: {click: () => setFilter(Object.fromEntries(keys.map((k) => [k, ''])))}}, '×'));
    const list = [];
    if (f.group) list.push(chipOf(`group ${f.group}`, ['group']));
    if (f.reward_min !== undefined || f.reward_max !== undefined) {
      list.push(chipOf(`reward ${fmtNum(Number(f.reward_min ?? NaN))} – ${fmtNum(Number(f.reward_max ?? NaN))}`, ['reward_min', 'reward_max']));
    }
    replace(chips, list);
    clearBtn.hidden = Object.keys(f).length === 0;
    const sort = query.sort || 'line';
    for (const cell of head.querySelectorAll('[data-test=sort]')) {
      const col = cell.dataset.column;
      const dir = sort === col ? 'ascending' : sort === '-' + col ? 'descending' : null;
      cell.classList.toggle('sorted', dir !== null);
      if (dir) cell.setAttribute('aria-sort', dir);
      else cell.removeAttribute('aria-sort');
      cell.querySelector('.arrow').textContent = dir === 'ascending' ? '▲' : dir === 'descending' ? '▼' : '';
    }
  }

  function renderSummary() {
    if (!state) return;
    matchedEl.textContent = String(state.matched);
    totalEl.textContent = ` of ${state.total} episodes`;
    const hg = state.histogram || {};
    const edges = Array.isArray(hg.edges) ? hg.edges : [];
    const counts = Array.isArray(hg.counts) ? hg.counts : [];
    if (edges.length >= 2) rewardRange = [edges[0], edges[edges.length - 1]];
    const max = Math.max(1, ...counts);
    const f = filtersOf(query);
    let selected = -1;
    for (let i = 0; i < counts.length; i++) {
      if (Number(f.reward_min) === edges[i] && Number(f.reward_max) === edges[i + 1]) selected = i;
    }
    const bins = counts.map((c, i) => {
      const hue = rewardHue((edges[i] + edges[i + 1]) / 2, rewardRange[0], rewardRange[1]);
      return h('button', {
        type: 'button', class: `bin${i === selected ? ' selected' : ''}${c === 0 ? ' zero' : ''}`,
        'data-test': 'bin', 'data-index': i, 'data-count': c,
        title: `${fmtNum(edges[i])} – ${fmtNum(edges[i + 1])}: ${fmtInt(c)} episodes`,
        'aria-pressed': i === selected ? 'true' : 'false',
        vars: {'--h': c === 0 ? 0 : Math.max(3, (100 * c) / max), '--hue': hue ?? 0},
        on: {click: () => {
          if (i === selected) setFilter({reward_min: '', reward_max: ''});
          else setFilter({reward_min: String(edges[i]), reward_max: String(edges[i + 1])});
        }},
      }, h('span', {class: 'bar'}));
    });
    hist.classList.toggle('has-selection', selected >= 0);
    replace(hist, bins.length ? bins : h('span', {class: 'muted hist-none'}, 'no rewards'));
    replace(histAxis, edges.length >= 2 ? [h('span', null, fmtNum(edges[0])), h('span', null, fmtNum(edges[edges.length - 1]))] : null);
    body.style.height = `${state.matched * ROW}px`;
    empty.hidden = state.matched !== 0;
  }

  // ---- rows ----
  function rowAt(i) {
    const p = Math.floor(i / PAGE);
    const page = pages.get(p) || stale.get(p);
    return page ? page[i - p * PAGE] : undefined;
  }

  function buildRow(i, row) {
    if (!row) {
      const el = h('div', {class: 'ep-row loading', role: 'row', 'aria-busy': 'true'}, h('div', {class: 'cell muted'}, '…'));
      el.style.top = `${i * ROW}px`;
      return el;
    }
    const cells = COLUMNS.map((c) => {
      if (c.key === 'reward') {
        const hue = rewardHue(row.reward, rewardRange[0], rewardRange[1]);
        return h('div', {class: `cell num reward${hue === null ? ' none' : ''}`, role: 'cell', vars: hue === null ? null : {'--hue': hue}}, fmtNum(row.reward));
      }
      if (c.key === 'line') {
        return h('div', {class: 'cell num', role: 'cell'}, h('a', {href: hashOf(['run', run, 'episode', row.line])}, String(row.line)));
      }
      let cls = `cell ${c.cls}`;
      if (c.key === 'ok' && row.ok === false) cls += ' bad';
      if (c.key === 'errors' && row.errors > 0) cls += ' bad';
      if (c.key === 'advantage' && typeof row.advantage === 'number') cls += row.advantage > 0 ? ' pos' : row.advantage < 0 ? ' neg' : '';
      const text = c.fmt(row);
      return h('div', {class: cls, role: 'cell', title: c.key === 'id' || c.key === 'env' ? text : null}, text);
    });
    const groupCell = h('div', {class: 'cell', role: 'cell'},
      row.group !== null && row.group !== undefined && row.group !== '' ?
        h('button', {type: 'button', class: 'mini-btn', 'data-test': 'group-link', title: `the episodes of group ${row.group}`,
          on: {click: (e) => { e.stopPropagation(); ctx.navigate(hashOf(['run', run, 'group', String(row.group)])); }}}, 'group') : null);
    const el = h('div', {
      class: `ep-row${i % 2 ? ' odd' : ''}`, role: 'row', 'data-test': 'episode-row', 'data-line': row.line,
      on: {click: (e) => {
        if (e.target.closest('a, button')) return;
        ctx.navigate(hashOf(['run', run, 'episode', row.line]));
      }},
    }, cells, groupCell);
    el.style.top = `${i * ROW}px`;
    return el;
  }

  function visibleRange() {
    const n = state ? state.matched : 0;
    const headH = head.offsetHeight;
    const top = scroller.scrollTop;
    const first = Math.max(0, Math.floor(top / ROW) - MARGIN);
    const last = Math.min(n, Math.ceil((top + scroller.clientHeight - headH) / ROW) + MARGIN);
    return [first, Math.max(first, last)];
  }

  function render() {
    rafPending = false;
    if (destroyed || !state) return;
    const [first, last] = visibleRange();
    for (const [i, r] of rendered) {
      if (i < first || i >= last) {
        r.el.remove();
        rendered.delete(i);
      }
    }
    const frag = document.createDocumentFragment();
    for (let i = first; i < last; i++) {
      const row = rowAt(i);
      const have = rendered.get(i);
      if (have && have.row === row) continue;
      const el = buildRow(i, row);
      if (have) have.el.replaceWith(el);
      else frag.append(el);
      rendered.set(i, {el, row});
    }
    body.append(frag);
    ensurePages(first, last);
  }

  function schedule() {
    if (!rafPending) {
      rafPending = true;
      requestAnimationFrame(render);
    }
  }

  function ensurePages(first, last) {
    if (!state || last <= first) return;
    const p0 = Math.floor(first / PAGE);
    const p1 = Math.floor((last - 1) / PAGE);
    // The middle of the view first.
    const mid = Math.floor((first + last) / 2 / PAGE);
    const want = [];
    for (let p = p0; p <= p1; p++) if (!pages.has(p) && !inflight.has(p)) want.push(p);
    want.sort((a, b) => Math.abs(a - mid) - Math.abs(b - mid));
    for (const p of want) {
      if (inflight.size >= MAX_INFLIGHT) break;
      fetchPage(p);
    }
  }

  function params(offset) {
    return {...filtersOf(query), sort: query.sort || undefined, offset, limit: PAGE};
  }

  async function fetchPage(p) {
    const myGen = gen;
    inflight.add(p);
    try {
      const data = await api.episodes(run, params(p * PAGE), {signal: ctx.signal});
      if (myGen !== gen || destroyed) return;
      accept(data, p);
    } catch (err) {
      if (myGen === gen) ctx.fail(err, 'episodes');
    } finally {
      if (myGen === gen) inflight.delete(p);
    }
    if (myGen === gen) schedule();
  }

  function accept(data, p) {
    state = data;
    pages.set(p, Array.isArray(data.rows) ? data.rows : []);
    stale.delete(p);
    if (pages.size > MAX_PAGES) {
      const keep = new Set(Array.from(rendered.keys(), (i) => Math.floor(i / PAGE)));
      for (const k of pages.keys()) {
        if (pages.size <= MAX_PAGES) break;
        if (!keep.has(k)) pages.delete(k);
      }
    }
    renderSummary();
    syncFacets();
  }

  let facetKey = '';
  function syncFacets() {
    const key = JSON.stringify(state.facets || {});
    if (key !== facetKey) {
      facetKey = key;
      syncControls();
    }
  }

  // Load the first screen of a (new) query; `keep` keeps the scroll position and old rows.
  async function load({keep = false} = {}) {
    gen += 1;
    const myGen = gen;
    inflight.clear();
    if (keep) {
      // The rows on screen stay until their fresh page replaces them; the rest are fetched
      // afresh when scrolled to.
      const shown = new Set(Array.from(rendered.keys(), (i) => Math.floor(i / PAGE)));
      const old = new Map([...stale, ...pages]);
      stale = new Map([...old].filter(([k]) => shown.has(k)));
    } else {
      stale = new Map();
      for (const r of rendered.values()) r.el.remove();
      rendered.clear();
      scroller.scrollTop = 0;
    }
    pages = new Map();
    const first = keep && state ? visibleRange()[0] : 0;
    const p = Math.floor(first / PAGE);
    try {
      const data = await api.episodes(run, params(p * PAGE), {signal: ctx.signal});
      if (myGen !== gen || destroyed) return;
      accept(data, p);
      syncControls();
      if (!keep) restoreScroll();
      render();
      ctx.setReady(true);
    } catch (err) {
      if (myGen === gen) ctx.fail(err, 'episodes');
    }
  }

  // ---- navigation ----
  function setFilter(changes) {
    const next = {...query, ...changes};
    for (const [k, v] of Object.entries(next)) if (v === '' || v === null || v === undefined) delete next[k];
    ctx.navigate(hashOf(['run', run], next));
  }

  function toggleSort(col) {
    const cur = query.sort || 'line';
    const next = cur === col ? '-' + col : col;
    setFilter({sort: next === 'line' ? '' : next});
  }

  // Remember the scroll position in the history entry: back, forward and reload come back to
  // it; a new visit (a new entry) starts at the top.
  let saveTimer = 0;
  function restoreScroll() {
    const y = history.state && Number(history.state.listScroll);
    if (y > 0) scroller.scrollTop = y;
  }

  scroller.addEventListener('scroll', () => {
    schedule();
    clearTimeout(saveTimer);
    const hash = location.hash;
    saveTimer = setTimeout(() => {
      if (location.hash === hash && ctx.isCurrent()) {
        history.replaceState({...(history.state || {}), listScroll: scroller.scrollTop}, '');
      }
    }, 250);
  }, {passive: true});
  const resize = new ResizeObserver(() => schedule());
  resize.observe(scroller);

  syncControls();
  load();

  return {
    update(route) {
      clearTimeout(saveTimer);
      query = {...route.query};
      syncControls();
      load();
    },
    status(st, prev) {
      if (st.episodes !== prev.episodes) load({keep: true});
    },
    destroy() {
      destroyed = true;
      resize.disconnect();
      clearTimeout(saveTimer);
    },
  };
}
