// `#/run/{run}/metrics`: one small SVG line plot per metric of metrics.jsonl, by step.
// Clicking a point (or anywhere on a plot: the nearest step) lists that step's episodes.

import {api} from './api.js';
import {fmtInt, fmtNum, h, hashOf, replace, s} from './dom.js';

const W = 320;
const H = 150;
const M = {left: 46, right: 10, top: 10, bottom: 22};
const MAX_CIRCLES = 400; // beyond this a plot keeps one hover marker instead of a dot per step

const compact = new Intl.NumberFormat('en-US', {notation: 'compact', maximumSignificantDigits: 3});

/** A short axis label: 4.93M, 0.465, 3e-6. */
function tick(v) {
  const a = Math.abs(v);
  if (a >= 1e4) return compact.format(v);
  if (a !== 0 && a < 1e-3) return v.toExponential(1);
  return String(Number(v.toPrecision(3)));
}

function extent(values) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return [lo, hi];
}

function plot(name, xs, ys, xr, onStep) {
  const pts = [];
  for (let i = 0; i < ys.length; i++) {
    const y = ys[i];
    if (typeof y === 'number' && Number.isFinite(y) && typeof xs[i] === 'number') pts.push({x: xs[i], y, i});
  }
  const last = pts.length ? pts[pts.length - 1] : null;
  const readout = h('span', {class: 'readout mono'}, last ? fmtNum(last.y) : '');
  const card = h('figure', {class: 'plot', 'data-test': 'plot', 'data-metric': name},
    h('figcaption', null, h('span', {class: 'metric-name mono', title: name}, name), readout));
  if (pts.length === 0) {
    card.append(s('svg', {viewBox: `0 0 ${W} ${H}`, class: 'plot-svg', role: 'img', 'aria-label': `${name}: no numbers`},
      s('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'empty-text'}, 'no numeric values')));
    return card;
  }
  let [ylo, yhi] = extent(pts.map((p) => p.y));
  const [xlo, xhi0] = xr;
  const xhi = xhi0 === xlo ? xlo + 1 : xhi0;
  const flat = ylo === yhi;
  if (flat) {
    const pad = Math.abs(ylo) * 0.1 || 1;
    ylo -= pad;
    yhi += pad;
  }
  const px = (x) => M.left + ((x - xlo) / (xhi - xlo)) * (W - M.left - M.right);
  const py = (y) => H - M.bottom - ((y - ylo) / (yhi - ylo)) * (H - M.top - M.bottom);

  // The line, broken where a row has no number.
  let d = '';
  let prev = -2;
  for (const p of pts) {
    d += `${p.i === prev + 1 ? 'L' : 'M'}${px(p.x).toFixed(1)} ${py(p.y).toFixed(1)}`;
    prev = p.i;
  }
  const y0 = H - M.bottom;
  const x0 = M.left;
  const x1 = W - M.right;
  const yTop = M.top;
  const ymid = (ylo + yhi) / 2;
  const svg = s('svg', {viewBox: `0 0 ${W} ${H}`, class: 'plot-svg', role: 'img', 'aria-label': `${name} by step`},
    s('line', {x1: x0, x2: x1, y1: yTop, y2: yTop, class: 'grid'}),
    s('line', {x1: x0, x2: x1, y1: py(ymid), y2: py(ymid), class: 'grid'}),
    s('line', {x1: x0, x2: x1, y1: y0, y2: y0, class: 'axis'}),
    s('line', {x1: x0, x2: x0, y1: yTop, y2: y0, class: 'axis'}),
    flat ? null : s('text', {x: x0 - 4, y: yTop + 4, 'text-anchor': 'end', class: 'tick'}, tick(yhi)),
    s('text', {x: x0 - 4, y: py(ymid) + 4, 'text-anchor': 'end', class: 'tick'}, tick(flat ? pts[0].y : ymid)),
    flat ? null : s('text', {x: x0 - 4, y: y0, 'text-anchor': 'end', class: 'tick'}, tick(ylo)),
    s('text', {x: x0, y: H - 6, 'text-anchor': 'start', class: 'tick'}, `step ${fmtInt(xlo)}`),
    s('text', {x: x1, y: H - 6, 'text-anchor': 'end', class: 'tick'}, fmtInt(xhi0)),
    s('path', {d, class: 'line'}));
  const dots = s('g', {class: 'dots'});
  if (pts.length <= MAX_CIRCLES) {
    for (const p of pts) {
      dots.append(s('circle', {cx: px(p.x).toFixed(1), cy: py(p.y).toFixed(1), r: pts.length > 100 ? 2 : 3,
        class: 'pt', 'data-test': 'step-point', 'data-step': p.x,
        on: {click: (e) => { e.stopPropagation(); onStep(p.x); }}},
      s('title', null, `step ${p.x}: ${fmtNum(p.y, 6)}`)));
    }
  }
  const cross = s('line', {x1: 0, x2: 0, y1: yTop, y2: y0, class: 'cross'});
  const marker = s('circle', {r: 4, class: 'marker', 'data-test': pts.length > MAX_CIRCLES ? 'step-point' : null});
  const hover = s('g', {class: 'hover'}, cross, marker);
  svg.append(dots, hover);

  const byX = [...pts].sort((a, b) => a.x - b.x);
  const nearest = (ev) => {
    const r = svg.getBoundingClientRect();
    if (r.width === 0) return null;
    // viewBox units (the plot keeps its aspect ratio: width decides the scale).
    const scale = W / r.width;
    const vx = (ev.clientX - r.left) * scale;
    const x = xlo + ((vx - M.left) / (W - M.left - M.right)) * (xhi - xlo);
    let lo = 0;
    let hi = byX.length - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (byX[mid].x < x) lo = mid + 1;
      else hi = mid;
    }
    const a = byX[lo];
    const b = byX[lo - 1];
    return b && Math.abs(b.x - x) < Math.abs(a.x - x) ? b : a;
  };
  svg.addEventListener('mousemove', (ev) => {
    const p = nearest(ev);
    if (!p) return;
    const cx = px(p.x).toFixed(1);
    cross.setAttribute('x1', cx);
    cross.setAttribute('x2', cx);
    marker.setAttribute('cx', cx);
    marker.setAttribute('cy', py(p.y).toFixed(1));
    marker.dataset.step = String(p.x);
    hover.classList.add('on');
    readout.textContent = `step ${p.x}: ${fmtNum(p.y, 6)}`;
  });
  svg.addEventListener('mouseleave', () => {
    hover.classList.remove('on');
    readout.textContent = last ? fmtNum(last.y) : '';
  });
  svg.addEventListener('click', (ev) => {
    const p = nearest(ev);
    if (p) onStep(p.x);
  });
  card.append(svg);
  return card;
}

export function mount(ctx) {
  const run = ctx.run;
  const search = h('input', {type: 'search', name: 'metric-filter', placeholder: 'filter metrics', 'aria-label': 'filter metrics',
    on: {input: () => applyFilter()}});
  const info = h('span', {class: 'muted'});
  const grid = h('div', {class: 'plots'});
  ctx.root.append(h('section', {class: 'metrics'},
    h('div', {class: 'metrics-top'}, h('h1', null, 'Metrics'), info, search), grid));
  const onStep = (step) => ctx.navigate(hashOf(['run', run], {step}));

  function applyFilter() {
    const needle = search.value.trim().toLowerCase();
    for (const card of grid.children) {
      card.hidden = needle !== '' && !card.dataset.metric.toLowerCase().includes(needle);
    }
  }

  let gen = 0;
  async function load() {
    const myGen = ++gen;
    try {
      const data = await api.metrics(run, {signal: ctx.signal});
      if (myGen !== gen || !ctx.isCurrent()) return;
      const steps = Array.isArray(data.step) ? data.step : [];
      const metrics = data.metrics && typeof data.metrics === 'object' ? data.metrics : {};
      const names = Object.keys(metrics);
      const xs = steps.map((st, i) => (typeof st === 'number' ? st : i));
      const xr = xs.length ? extent(xs) : [0, 1];
      info.textContent = `${fmtInt(names.length)} metrics · ${fmtInt(steps.length)} rows` +
        (xs.length ? ` · steps ${xr[0]}–${xr[1]}` : '');
      const cards = names.map((name) => plot(name, xs, Array.isArray(metrics[name]) ? metrics[name] : [], xr, onStep));
      replace(grid, cards.length ? cards : h('p', {class: 'muted'}, 'This run has no metrics.jsonl rows yet.'));
      applyFilter();
      ctx.setReady(true);
    } catch (err) {
      if (myGen === gen) ctx.fail(err, 'metrics');
    }
  }
  load();
  return {
    status(st, prev) {
      if (st.metrics !== prev.metrics) load();
    },
  };
}
