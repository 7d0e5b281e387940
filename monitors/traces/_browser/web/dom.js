// A tiny DOM builder that can only ever put text into the page.
//
// Record contents are untrusted: every string becomes a text node (never parsed as HTML),
// attributes come from a fixed safe list, and an `href` must be an internal `#...` hash, so a
// record can never inject markup, script, event handlers or an outside URL.

const SVG_NS = 'http://www.w3.org/2000/svg';

// Attributes that can carry nothing executable. `data-*` and `aria-*` are allowed too.
const SAFE_ATTRS = new Set([
  'class', 'id', 'title', 'type', 'name', 'value', 'placeholder', 'min', 'max', 'step',
  'for', 'role', 'tabindex', 'disabled', 'checked', 'selected', 'hidden', 'open', 'colspan',
  'inputmode', 'autocomplete', 'spellcheck', 'lang', 'dir', 'width', 'height', 'viewBox',
  'x', 'y', 'x1', 'x2', 'y1', 'y2', 'cx', 'cy', 'r', 'rx', 'ry', 'd', 'points', 'fill',
  'stroke', 'stroke-width', 'stroke-dasharray', 'text-anchor', 'dominant-baseline',
  'transform', 'preserveAspectRatio', 'vector-effect', 'opacity', 'fill-opacity', 'href',
]);

function setAttr(el, key, value) {
  if (value === null || value === undefined || value === false) return;
  if (!(SAFE_ATTRS.has(key) || key.startsWith('data-') || key.startsWith('aria-'))) {
    throw new Error(`dom: attribute ${key} is not allowed`);
  }
  const text = value === true ? '' : String(value);
  // Links only ever point inside the page: a hash route.
  if (key === 'href' && !text.startsWith('#')) throw new Error('dom: href must be a #hash');
  el.setAttribute(key, text);
}

// Control characters (an ANSI escape, a NUL) are shown as their JSON escapes: a terminal's
// colour codes in a tool's output read as \u001b[31m, not as nothing or an empty box (the
// Control Pictures block, U+2400 on, is missing from many fonts).
const CONTROL = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/g;
const controlEscape = (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0');

/** Text as shown: control characters but tab and newlines written as escapes. */
export function shown(text) {
  return String(text).replace(CONTROL, controlEscape);
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(shown(child)));
  }
}

function build(el, attrs, children) {
  if (attrs) {
    for (const [key, value] of Object.entries(attrs)) {
      if ((key === 'on' || key === 'vars') && !value) continue;
      if (key === 'on') {
        for (const [type, fn] of Object.entries(value)) el.addEventListener(type, fn);
      } else if (key === 'vars') {
        // CSS custom properties through the CSSOM (allowed under the page's CSP).
        for (const [name, v] of Object.entries(value)) el.style.setProperty(name, String(v));
      } else if (key === 'text') {
        el.textContent = value === null || value === undefined ? '' : shown(value);
      } else {
        setAttr(el, key, value);
      }
    }
  }
  append(el, children);
  return el;
}

/** An HTML element: `h('div', {class: 'x', on: {click: f}}, 'text', child, [more])`. */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** An SVG element, built the same way. */
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** Replace all children of `el` with `children`. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A `#/run/...` hash from path parts; strings are percent-encoded, numbers checked. */
export function hashOf(parts, query) {
  const path = parts.map((p) => {
    if (typeof p === 'number') {
      if (!Number.isFinite(p)) throw new Error('dom: bad number in a route');
      return String(p);
    }
    return encodeURIComponent(String(p));
  });
  let hash = '#/' + path.join('/');
  if (query) {
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) {
      if (v !== null && v !== undefined && v !== '') qs.set(k, String(v));
    }
    const text = qs.toString();
    if (text) hash += '?' + text;
  }
  return hash;
}

const intFmt = new Intl.NumberFormat('en-US');

/** 12,345 */
export function fmtInt(n) {
  return n === null || n === undefined ? '—' : intFmt.format(n);
}

/** A compact number: 0.1235, 1.2e-6, 12,345. */
export function fmtNum(v, digits = 4) {
  if (v === null || v === undefined) return '—';
  if (typeof v !== 'number') return String(v);
  if (!Number.isFinite(v)) return String(v);
  if (Number.isInteger(v) && Math.abs(v) < 1e15) return intFmt.format(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
  return String(Number(v.toPrecision(digits)));
}

/** 6.4 MB */
export function fmtBytes(n) {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let v = n;
  let i = 0;
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i += 1;
  }
  return (i === 0 ? String(v) : v.toFixed(v < 10 ? 1 : 0)) + ' ' + units[i];
}

/** 18.8 s, 3 m 02 s */
export function fmtDuration(sec) {
  if (sec === null || sec === undefined) return '—';
  if (sec < 59.95) return `${sec.toFixed(1)} s`;
  const whole = Math.round(sec);
  const m = Math.floor(whole / 60);
  const r = whole - m * 60;
  return `${m} m ${String(r).padStart(2, '0')} s`;
}

/** A hue from red (0) to green (1) for a value within [lo, hi]. */
export function rewardHue(v, lo, hi) {
  if (v === null || v === undefined || !Number.isFinite(v)) return null;
  let t = 0.5;
  if (Number.isFinite(lo) && Number.isFinite(hi) && hi > lo) t = (v - lo) / (hi - lo);
  else if (v <= 0) t = 0;
  else if (v >= 1) t = 1;
  t = Math.max(0, Math.min(1, t));
  return Math.round(t * 130);
}

/** A number coloured by its reward hue. */
export function rewardEl(v, lo = 0, hi = 1, tag = 'span') {
  const hue = rewardHue(v, lo, hi);
  return h(tag, {
    class: hue === null ? 'reward none' : 'reward',
    vars: hue === null ? null : {'--hue': hue},
  }, fmtNum(v));
}

/** A value as short text: `{"$bytes": N}` is a field the server left out. */
export function valueText(v) {
  if (v === null || v === undefined) return 'null';
  if (isOmitted(v)) return `(${fmtInt(v.$bytes)} bytes)`;
  if (typeof v === 'string') return v;
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  return JSON.stringify(v);
}

export function isOmitted(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v) &&
    Object.keys(v).length === 1 && typeof v.$bytes === 'number';
}

/** A key/value list of record fields: scalars inline, objects as collapsible JSON. */
export function fieldList(fields, {skip = []} = {}) {
  const dl = h('dl', {class: 'fields'});
  if (!fields || typeof fields !== 'object') return dl;
  for (const [key, value] of Object.entries(fields)) {
    if (skip.includes(key)) continue;
    dl.append(h('dt', null, key), h('dd', null, fieldValue(value)));
  }
  return dl;
}

const LONG = 300; // chars of a string field shown before "show all"

export function fieldValue(value) {
  if (isOmitted(value)) return h('span', {class: 'muted'}, valueText(value));
  if (typeof value === 'string' && value.length > LONG) {
    const rest = h('span');
    const more = h('button', {type: 'button', class: 'link-btn', on: {click: () => {
      rest.textContent = shown(value.slice(LONG));
      more.remove();
    }}}, `… show all ${fmtInt(value.length)} chars`);
    return h('span', {class: 'str'}, value.slice(0, LONG), rest, more);
  }
  if (value === null || typeof value !== 'object') {
    const cls = typeof value === 'boolean' ? `bool ${value}` :
      typeof value === 'number' ? 'num' : value === null ? 'muted' : 'str';
    return h('span', {class: cls}, valueText(value));
  }
  const empty = Array.isArray(value) ? value.length === 0 : Object.keys(value).length === 0;
  const short = JSON.stringify(value);
  if (empty || short.length <= 100) return h('span', {class: 'json'}, short);
  // Pretty JSON is only built when opened.
  const pre = h('pre', {class: 'json'});
  const details = h('details', {
    class: 'json',
    on: {toggle: () => { if (details.open && !pre.firstChild) pre.textContent = shown(JSON.stringify(value, null, 2)); }},
  }, h('summary', null, short.slice(0, 100) + '…'), pre);
  return details;
}
