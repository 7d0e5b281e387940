// A line diff: Myers' O(ND) algorithm in linear space (the "middle snake" divide and
// conquer), over line ids, with caps on the work.
//
// `diffLines(a, b)` returns {ops: [{op: 'same'|'del'|'add', a: i|null, b: j|null}], truncated,
// gaveUp}: `truncated` when a side had more than `maxLines` lines (the rest is not compared),
// `gaveUp` when the search spent its `budget` of steps (the parts not yet compared are then
// shown as deleted then added: correct, but not minimal). Memory stays O(lines).

export const MAX_LINES = 20000;
/** Steps of the search (a few hundred ms of work) before it gives up on what is left. */
export const BUDGET = 15_000_000;
/** Above this many lines in all, lines unique to both sides anchor the diff first
 * (as "patience diff" does): far less search on long texts, at times a less minimal diff. */
export const ANCHOR_ABOVE = 2000;

export function splitLines(text) {
  if (text === '') return [];
  const lines = text.split('\n');
  if (lines[lines.length - 1] === '') lines.pop();
  return lines;
}

export function diffLines(aLines, bLines, {maxLines = MAX_LINES, budget = BUDGET} = {}) {
  const truncated = aLines.length > maxLines || bLines.length > maxLines;
  const A = aLines.slice(0, maxLines);
  const B = bLines.slice(0, maxLines);
  // Lines to small integers: comparisons become integer compares.
  const ids = new Map();
  const idOf = (line) => {
    let id = ids.get(line);
    if (id === undefined) {
      id = ids.size;
      ids.set(line, id);
    }
    return id;
  };
  const a = Int32Array.from(A, idOf);
  const b = Int32Array.from(B, idOf);
  const size = Math.ceil((a.length + b.length) / 2) + 2;
  const state = {
    a, b, ops: [], left: budget, gaveUp: false,
    off: size, vf: new Int32Array(2 * size + 1), vb: new Int32Array(2 * size + 1),
  };
  if (a.length + b.length > ANCHOR_ABOVE) {
    let i0 = 0;
    let j0 = 0;
    for (const [i, j] of anchors(a, b, ids.size)) {
      compare(state, i0, i - i0, j0, j - j0);
      state.ops.push({op: 'same', a: i, b: j});
      i0 = i + 1;
      j0 = j + 1;
    }
    compare(state, i0, a.length - i0, j0, b.length - j0);
  } else {
    compare(state, 0, a.length, 0, b.length);
  }
  return {ops: state.ops, truncated, gaveUp: state.gaveUp};
}

// Pairs (i, j), increasing in both, of lines that occur once in a and once in b: the longest
// increasing run of their positions in b, taken in a's order.
function anchors(a, b, nIds) {
  const countA = new Int32Array(nIds);
  const countB = new Int32Array(nIds);
  const posB = new Int32Array(nIds);
  for (const id of a) countA[id]++;
  for (let j = 0; j < b.length; j++) {
    countB[b[j]]++;
    posB[b[j]] = j;
  }
  const is = [];
  const js = [];
  for (let i = 0; i < a.length; i++) {
    const id = a[i];
    if (countA[id] === 1 && countB[id] === 1) {
      is.push(i);
      js.push(posB[id]);
    }
  }
  // Longest increasing subsequence of js (patience sorting, O(k log k)).
  const tops = []; // index into js of the smallest tail of each length
  const prev = new Int32Array(js.length);
  for (let k = 0; k < js.length; k++) {
    let lo = 0;
    let hi = tops.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (js[tops[mid]] < js[k]) lo = mid + 1;
      else hi = mid;
    }
    prev[k] = lo > 0 ? tops[lo - 1] : -1;
    tops[lo] = k;
  }
  const out = [];
  for (let k = tops.length ? tops[tops.length - 1] : -1; k >= 0; k = prev[k]) out.push([is[k], js[k]]);
  return out.reverse();
}

function compare(st, a0, n, b0, m) {
  const {a, b, ops} = st;
  // The common head and tail need no search.
  let head = 0;
  while (head < n && head < m && a[a0 + head] === b[b0 + head]) head++;
  for (let i = 0; i < head; i++) ops.push({op: 'same', a: a0 + i, b: b0 + i});
  a0 += head;
  b0 += head;
  n -= head;
  m -= head;
  let tail = 0;
  while (tail < n && tail < m && a[a0 + n - 1 - tail] === b[b0 + m - 1 - tail]) tail++;
  n -= tail;
  m -= tail;
  if (n === 0 || m === 0 || st.left <= 0) {
    if (n > 0 && m > 0) st.gaveUp = true;
    for (let i = 0; i < n; i++) ops.push({op: 'del', a: a0 + i, b: null});
    for (let j = 0; j < m; j++) ops.push({op: 'add', a: null, b: b0 + j});
  } else {
    const snake = middleSnake(st, a0, n, b0, m);
    if (snake === null) {
      st.gaveUp = true;
      for (let i = 0; i < n; i++) ops.push({op: 'del', a: a0 + i, b: null});
      for (let j = 0; j < m; j++) ops.push({op: 'add', a: null, b: b0 + j});
    } else {
      // Both ends differ and neither side is empty, so D >= 2 and both halves are smaller.
      const [x1, y1, x2, y2] = snake;
      compare(st, a0, x1, b0, y1);
      for (let i = 0; i < x2 - x1; i++) ops.push({op: 'same', a: a0 + x1 + i, b: b0 + y1 + i});
      compare(st, a0 + x2, n - x2, b0 + y2, m - y2);
    }
  }
  for (let k = tail; k > 0; k--) ops.push({op: 'same', a: a0 + n + tail - k, b: b0 + m + tail - k});
}

// The middle snake of a[a0, a0+n) vs b[b0, b0+m): [x1, y1, x2, y2] (relative), where the
// forward and the backward searches meet; null when the budget ran out.
function middleSnake(st, a0, n, b0, m) {
  const {a, b, vf, vb, off} = st;
  const delta = n - m;
  const odd = (delta & 1) !== 0;
  const max = Math.ceil((n + m) / 2);
  vf[off + 1] = 0;
  vb[off + 1] = 0;
  let steps = 0;
  for (let d = 0; d <= max; d++) {
    if (steps > st.left) return null;
    for (let k = -d; k <= d; k += 2) {
      let x = k === -d || (k !== d && vf[off + k - 1] < vf[off + k + 1]) ? vf[off + k + 1] : vf[off + k - 1] + 1;
      let y = x - k;
      const sx = x;
      const sy = y;
      while (x < n && y < m && a[a0 + x] === b[b0 + y]) {
        x++;
        y++;
      }
      steps += x - sx + 1;
      vf[off + k] = x;
      // Forward diagonal k is backward diagonal delta - k (in reversed coordinates).
      if (odd && k >= delta - (d - 1) && k <= delta + (d - 1) && x + vb[off + delta - k] >= n) {
        st.left -= steps;
        return [sx, sy, x, y];
      }
    }
    for (let k = -d; k <= d; k += 2) {
      let x = k === -d || (k !== d && vb[off + k - 1] < vb[off + k + 1]) ? vb[off + k + 1] : vb[off + k - 1] + 1;
      let y = x - k;
      const sx = x;
      const sy = y;
      while (x < n && y < m && a[a0 + n - 1 - x] === b[b0 + m - 1 - y]) {
        x++;
        y++;
      }
      steps += x - sx + 1;
      vb[off + k] = x;
      if (!odd && delta - k >= -d && delta - k <= d && x + vf[off + delta - k] >= n) {
        st.left -= steps;
        return [n - x, m - y, n - sx, m - sy];
      }
    }
  }
  st.left -= steps;
  return null; // not reached: the searches meet by D = n + m
}
