// A node's tokens as a heatmap on a <canvas>: one cell per token, COLS to a row, coloured by
// an overlay (logprobs, advantages, mask, is_content).
//
// Windowed: the canvas is only as tall as its scroll box and sticks to the box's top, a spacer
// gives the box the full height, and each scroll redraws just the rows in view. The colours
// are computed once per overlay into a bitmap of one pixel per token; a redraw scales the
// window's rows of it up (one drawImage), so 32,768 tokens cost what a screenful does.

import {fmtInt, fmtNum, h} from './dom.js';

const COLS = 64;
const CELL_H = 12;
const MAX_VIEW = 300; // px of the scroll box
const OVERLAYS = ['logprobs', 'advantages', 'mask', 'is_content'];
const LEVELS = 64;
const MAX_BITMAP_ROWS = 16384; // rows of the one-pixel bitmap (a canvas side stays < 32,767)

let lastOverlay = null; // the overlay last chosen, for the next heatmap opened

// Colours are [r, g, b].
const NONE = [236, 239, 243]; // a token without a value
const OFF = [221, 225, 230];
const ON = {mask: [66, 99, 235], is_content: [240, 140, 0]};

function ramp(stops) {
  // stops: [[t, [r,g,b]], ...] -> LEVELS+1 colours
  const out = [];
  for (let k = 0; k <= LEVELS; k++) {
    const t = k / LEVELS;
    let j = 0;
    while (j < stops.length - 2 && t > stops[j + 1][0]) j++;
    const [ta, ca] = stops[j];
    const [tb, cb] = stops[j + 1];
    const f = tb === ta ? 0 : (t - ta) / (tb - ta);
    out.push(ca.map((x, i) => Math.round(x + (cb[i] - x) * f)));
  }
  return out;
}

const RED = [215, 48, 39];
const PALETTES = {
  // probability exp(logprob): dark red (unlikely) to pale (certain)
  logprobs: ramp([[0, [165, 0, 38]], [0.35, RED], [0.7, [253, 174, 97]], [1, [240, 244, 236]]]),
  // advantage: red (negative), pale (0), green (positive)
  advantages: ramp([[0, RED], [0.5, [246, 246, 244]], [1, [26, 152, 80]]]),
};

const css = (c) => `rgb(${c[0]},${c[1]},${c[2]})`;

function arrayOf(tokens, name) {
  const a = tokens[name];
  return Array.isArray(a) && a.length > 0 ? a : null;
}

function truthy(v) {
  return v === true || v === 1;
}

/** The heatmap element of a node's `tokens` answer. */
export function heatmap(tokens) {
  const count = Math.max(0, Math.floor(Number(tokens.count) || 0));
  const ids = Array.isArray(tokens.token_ids) ? tokens.token_ids : [];
  const arrays = Object.fromEntries(OVERLAYS.map((name) => [name, arrayOf(tokens, name)]));
  let maxAbsAdv = 0;
  if (arrays.advantages) {
    for (const v of arrays.advantages) if (typeof v === 'number' && Math.abs(v) > maxAbsAdv) maxAbsAdv = Math.abs(v);
  }
  if (maxAbsAdv === 0) maxAbsAdv = 1;

  let overlay = lastOverlay && arrays[lastOverlay] ? lastOverlay : OVERLAYS.find((o) => arrays[o]) || 'logprobs';

  const select = h('select', {name: 'overlay', 'aria-label': 'colour tokens by'},
    OVERLAYS.map((o) => h('option', {value: o}, arrays[o] ? o : `${o} (none)`)));
  select.value = overlay;
  const legend = h('span', {class: 'hm-legend'});
  const stats = h('span', {class: 'hm-stats muted'});
  // No size until laid out (a canvas's default 300x150 would be an empty picture).
  const canvas = h('canvas', {class: 'hm-canvas', width: 0, height: 0, 'aria-label': `${count} tokens`});
  const spacer = h('div', {class: 'hm-spacer'});
  const box = h('div', {class: 'hm-scroll', tabindex: 0}, canvas, spacer);
  const tip = h('div', {class: 'hm-tip mono', hidden: true, role: 'tooltip'});
  const root = h('div', {class: 'heatmap', 'data-test': 'heatmap', 'data-count': count, 'data-drawn': 0, 'data-overlay': overlay},
    h('div', {class: 'hm-bar'},
      h('span', {class: 'hm-title'}, `${fmtInt(count)} tokens`),
      h('label', {class: 'ctl'}, h('span', null, 'colour'), select),
      legend, stats),
    box, tip);

  const rows = Math.ceil(count / COLS);
  const total = rows * CELL_H;
  const viewH = Math.min(total, MAX_VIEW);
  // The box's height never depends on its width: a resize cannot feed back into itself.
  box.style.height = `${viewH}px`;
  spacer.style.height = `${Math.max(0, total - viewH)}px`;
  let cellW = 12;
  let laidWidth = -1;
  let hover = -1;
  let raf = 0;
  let bitmap = null; // one pixel per token, in the current overlay's colours

  function colourOf(i) {
    const a = arrays[overlay];
    if (!a || i >= a.length) return NONE;
    const v = a[i];
    if (overlay === 'logprobs') {
      if (typeof v !== 'number') return NONE;
      return PALETTES.logprobs[Math.round(Math.exp(Math.min(0, v)) * LEVELS)];
    }
    if (overlay === 'advantages') {
      if (typeof v !== 'number') return NONE;
      return PALETTES.advantages[Math.round(Math.max(0, Math.min(1, 0.5 + v / (2 * maxAbsAdv))) * LEVELS)];
    }
    if (v === null || v === undefined) return NONE;
    return truthy(v) ? ON[overlay] : OFF;
  }

  function buildBitmap() {
    bitmap = null;
    if (rows === 0 || rows > MAX_BITMAP_ROWS) return; // drawn cell by cell instead
    const c = document.createElement('canvas');
    c.width = COLS;
    c.height = rows;
    const g = c.getContext('2d');
    if (!g) return;
    const img = g.createImageData(COLS, rows);
    const px = img.data;
    for (let i = 0; i < count; i++) {
      const [r, gr, b] = colourOf(i);
      px[4 * i] = r;
      px[4 * i + 1] = gr;
      px[4 * i + 2] = b;
      px[4 * i + 3] = 255;
    }
    g.putImageData(img, 0, 0);
    bitmap = c;
  }

  function layout() {
    const avail = box.clientWidth;
    if (avail === laidWidth || avail === 0) return;
    laidWidth = avail;
    cellW = Math.max(4, Math.min(20, Math.floor(avail / COLS)));
    const dpr = window.devicePixelRatio || 1;
    const cssW = cellW * COLS;
    canvas.style.width = `${cssW}px`;
    canvas.style.height = `${viewH}px`;
    canvas.width = Math.round(cssW * dpr);
    canvas.height = Math.round(viewH * dpr);
    draw();
  }

  function draw() {
    raf = 0;
    if (laidWidth <= 0) return;
    const g = canvas.getContext('2d');
    if (!g) return;
    const dpr = window.devicePixelRatio || 1;
    const width = cellW * COLS;
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.imageSmoothingEnabled = false;
    g.fillStyle = '#ffffff';
    g.fillRect(0, 0, width, viewH);
    const top = box.scrollTop;
    const r0 = Math.floor(top / CELL_H);
    const r1 = Math.min(rows, Math.ceil((top + viewH) / CELL_H));
    if (r1 > r0) {
      if (bitmap) {
        g.drawImage(bitmap, 0, r0, COLS, r1 - r0, 0, r0 * CELL_H - top, width, (r1 - r0) * CELL_H);
      } else {
        for (let i = r0 * COLS; i < Math.min(count, r1 * COLS); i++) {
          g.fillStyle = css(colourOf(i));
          g.fillRect((i % COLS) * cellW, Math.floor(i / COLS) * CELL_H - top, cellW, CELL_H);
        }
      }
      // The grid: a white line after each cell and each row.
      g.fillStyle = '#ffffff';
      if (cellW >= 6) for (let c = 1; c <= COLS; c++) g.fillRect(c * cellW - 1, 0, 1, viewH);
      for (let r = r0; r < r1; r++) g.fillRect(0, (r + 1) * CELL_H - top - 1, width, 1);
    }
    if (hover >= 0 && hover < count) {
      const r = Math.floor(hover / COLS);
      if (r >= r0 && r < r1) {
        g.strokeStyle = '#111';
        g.lineWidth = 1.5;
        g.strokeRect((hover % COLS) * cellW + 0.75, r * CELL_H - top + 0.75, cellW - 2.5, CELL_H - 2.5);
      }
    }
    root.dataset.drawn = String(Math.max(0, Math.min(count, r1 * COLS) - r0 * COLS));
    root.dataset.overlay = overlay;
  }

  function schedule() {
    if (!raf) raf = requestAnimationFrame(draw);
  }

  function renderLegend() {
    let items;
    if (!arrays[overlay]) {
      items = [h('span', {class: 'muted'}, `no ${overlay} in this node`)];
    } else if (overlay === 'logprobs') {
      items = [h('span', null, 'p 0'), swatchRamp(PALETTES.logprobs), h('span', null, 'p 1')];
    } else if (overlay === 'advantages') {
      items = [h('span', null, fmtNum(-maxAbsAdv, 3)), swatchRamp(PALETTES.advantages), h('span', null, `+${fmtNum(maxAbsAdv, 3)}`)];
    } else {
      items = [swatch(OFF), h('span', null, 'false'), swatch(ON[overlay]), h('span', null, 'true')];
    }
    legend.replaceChildren(...items, swatch(NONE), h('span', {class: 'muted'}, 'none'));
    stats.textContent = statsText();
  }

  function statsText() {
    const a = arrays[overlay];
    if (!a) return '';
    if (overlay === 'logprobs' || overlay === 'advantages') {
      let sum = 0;
      let n = 0;
      for (const v of a) {
        if (typeof v === 'number') {
          sum += v;
          n++;
        }
      }
      return n ? `mean ${fmtNum(sum / n, 3)} over ${fmtInt(n)}` : '';
    }
    let on = 0;
    for (const v of a) if (truthy(v)) on++;
    return `${fmtInt(on)} of ${fmtInt(a.length)} true`;
  }

  function describe(i) {
    const parts = [`#${i}`, `id ${ids[i] ?? '—'}`];
    const lp = arrays.logprobs && arrays.logprobs[i];
    if (typeof lp === 'number') parts.push(`logprob ${fmtNum(lp, 4)} (p ${Math.exp(lp).toFixed(3)})`);
    const adv = arrays.advantages && arrays.advantages[i];
    if (typeof adv === 'number') parts.push(`adv ${fmtNum(adv, 4)}`);
    for (const name of ['mask', 'is_content']) {
      const a = arrays[name];
      if (a && i < a.length && a[i] !== null) parts.push(`${name} ${truthy(a[i]) ? 1 : 0}`);
    }
    return parts.join('  ');
  }

  select.addEventListener('change', () => {
    overlay = OVERLAYS.includes(select.value) ? select.value : 'logprobs';
    lastOverlay = overlay;
    buildBitmap();
    renderLegend();
    draw();
  });
  box.addEventListener('scroll', schedule, {passive: true});
  canvas.addEventListener('mousemove', (ev) => {
    const rect = canvas.getBoundingClientRect();
    const col = Math.floor((ev.clientX - rect.left) / cellW);
    const row = Math.floor((ev.clientY - rect.top + box.scrollTop) / CELL_H);
    const i = row * COLS + col;
    if (col < 0 || col >= COLS || i < 0 || i >= count) {
      hideTip();
      return;
    }
    if (i !== hover) {
      hover = i;
      tip.textContent = describe(i);
      schedule();
    }
    tip.hidden = false;
    const host = root.getBoundingClientRect();
    let left = ev.clientX - host.left + 14;
    if (left > host.width - tip.offsetWidth - 4) left = Math.max(0, ev.clientX - host.left - tip.offsetWidth - 14);
    tip.style.left = `${left}px`;
    tip.style.top = `${ev.clientY - host.top + 16}px`;
  });
  function hideTip() {
    tip.hidden = true;
    if (hover !== -1) {
      hover = -1;
      schedule();
    }
  }
  canvas.addEventListener('mouseleave', hideTip);

  buildBitmap();
  renderLegend();
  // Lay out once attached (its width is known then), and again when the width changes.
  new ResizeObserver(() => layout()).observe(box);
  return root;
}

function swatch(colour) {
  const el = h('span', {class: 'swatch'});
  el.style.background = css(colour);
  return el;
}

function swatchRamp(palette) {
  const el = h('span', {class: 'swatch-ramp'});
  const stops = [0, 0.25, 0.5, 0.75, 1].map((t) => css(palette[Math.round(t * LEVELS)]));
  el.style.background = `linear-gradient(to right, ${stops.join(', ')})`;
  return el;
}
