// `#/run/{run}/group/{group}`: a group's rollouts side by side; pick two for
// `#/run/{run}/diff/{a}/{b}`: a unified line diff of their transcripts.

import {api} from './api.js';
import {fmtInt, fmtNum, h, hashOf, replace, rewardEl} from './dom.js';
import {diffLines, MAX_LINES, splitLines} from './diff.js';

const PREVIEW_NODES = 40; // node previews per rollout column
const OUTLINE_CONCURRENCY = 3;
const CONTEXT = 3; // unchanged lines kept around a change
const RENDER_CHUNK = 4000; // diff lines put in the DOM at a time

export function mount(ctx) {
  return ctx.route.view === 'diff' ? mountDiff(ctx) : mountGroup(ctx);
}

// ---- group ----

function roleClass(role) {
  return ['system', 'user', 'assistant', 'tool', 'developer'].includes(role) ? `role-${role}` : 'role-other';
}

function mountGroup(ctx) {
  const run = ctx.run;
  const group = ctx.route.group;
  const picked = [];
  const diffBtn = h('button', {type: 'button', class: 'btn primary', 'data-test': 'open-diff', disabled: true,
    on: {click: () => { if (picked.length === 2) ctx.navigate(hashOf(['run', run, 'diff', picked[0], picked[1]])); }}}, 'Diff the two picked');
  const info = h('span', {class: 'muted'}, 'Loading…');
  const columns = h('div', {class: 'rollouts'});
  ctx.root.append(h('section', {class: 'group'},
    h('header', {class: 'group-head'},
      h('h1', null, 'Group ', h('span', {class: 'mono group-id'}, group)),
      info,
      h('span', {class: 'spacer'}),
      h('span', {class: 'muted'}, 'pick two rollouts'),
      diffBtn,
      h('a', {class: 'btn', href: hashOf(['run', run], {group, sort: '-reward'})}, 'as a list')),
    columns));
  const boxes = new Map();

  function setPicked() {
    for (const [line, box] of boxes) {
      box.checked = picked.includes(line);
      box.closest('[data-test=rollout]').classList.toggle('picked', box.checked);
    }
    diffBtn.disabled = picked.length !== 2;
    diffBtn.textContent = picked.length === 2 ? `Diff #${picked[0]} ↔ #${picked[1]}` : 'Diff the two picked';
  }

  function pick(line, on) {
    const i = picked.indexOf(line);
    if (i >= 0) picked.splice(i, 1);
    if (on) {
      picked.push(line);
      while (picked.length > 2) picked.shift();
    }
    setPicked();
  }

  function column(row, lo, hi) {
    const line = row.line;
    const box = h('input', {type: 'checkbox', name: 'pick', value: line, 'aria-label': `pick episode ${line} for the diff`,
      on: {change: () => pick(line, box.checked)}});
    boxes.set(line, box);
    const body = h('div', {class: 'rollout-nodes'}, h('p', {class: 'muted'}, 'Loading outline…'));
    const col = h('article', {class: 'rollout', 'data-test': 'rollout', 'data-line': line},
      h('header', {class: 'rollout-head'},
        h('label', {class: 'pick'}, box),
        h('a', {href: hashOf(['run', run, 'episode', line]), class: 'rollout-link'}, `#${line}`),
        rewardEl(row.reward, lo, hi, 'span'),
        row.ok === false ? h('span', {class: 'badge bad'}, 'failed') : null,
        row.errors > 0 ? h('span', {class: 'badge bad'}, `${row.errors} err`) : null),
      h('div', {class: 'rollout-stats muted'},
        `${fmtInt(row.tokens)} tok · ${fmtInt(row.turns)} turns · adv ${fmtNum(row.advantage, 3)}`),
      body);
    return {col, body, row};
  }

  function fillNodes(body, line, outline) {
    const traces = Array.isArray(outline.traces) ? outline.traces : [];
    const items = [];
    for (const trace of traces.slice(0, 2)) {
      const nodes = Array.isArray(trace.nodes) ? trace.nodes : [];
      const t = trace.index;
      if (traces.length > 1) items.push(h('div', {class: 'trace-label muted'}, `trace ${t}${trace.agent ? ' · ' + trace.agent : ''}`));
      for (const node of nodes.slice(0, PREVIEW_NODES)) {
        items.push(h('a', {class: `mini-node ${roleClass(node.role)}`, href: hashOf(['run', run, 'episode', line, 'trace', t, 'node', node.index]),
          title: `node ${node.index} · ${fmtInt(node.tokens)} tokens`},
        h('span', {class: `role ${roleClass(node.role)}`}, String(node.role ?? '?')),
        node.error ? h('span', {class: 'badge bad'}, 'error') : null,
        node.tool_calls > 0 ? h('span', {class: 'badge tool'}, `${node.tool_calls} call${node.tool_calls > 1 ? 's' : ''}`) : null,
        h('span', {class: 'mini-preview'}, String(node.preview ?? ''))));
      }
      if (nodes.length > PREVIEW_NODES) items.push(h('div', {class: 'muted more'}, `+ ${fmtInt(nodes.length - PREVIEW_NODES)} more nodes`));
    }
    if (traces.length > 2) items.push(h('div', {class: 'muted more'}, `+ ${traces.length - 2} more traces`));
    replace(body, items.length ? items : h('p', {class: 'muted'}, 'no nodes'));
  }

  (async () => {
    try {
      const data = await api.episodes(run, {group, sort: '-reward', limit: 1000}, {signal: ctx.signal});
      if (!ctx.isCurrent()) return;
      const rows = Array.isArray(data.rows) ? data.rows : [];
      const edges = (data.histogram && data.histogram.edges) || [];
      const lo = edges.length ? edges[0] : 0;
      const hi = edges.length ? edges[edges.length - 1] : 1;
      info.textContent = `${fmtInt(data.matched)} rollouts, best reward first`;
      const cols = rows.map((row) => column(row, lo, hi));
      replace(columns, cols.length ? cols.map((c) => c.col) : h('p', {class: 'muted'}, 'No episodes in this group.'));
      if (rows.length >= 2) {
        picked.push(rows[0].line, rows[rows.length - 1].line);
        setPicked();
      }
      // The outlines, a few at a time (a 60 MB episode's first outline takes ~1 s).
      let next = 0;
      const worker = async () => {
        while (next < cols.length && ctx.isCurrent()) {
          const c = cols[next++];
          try {
            fillNodes(c.body, c.row.line, await api.outline(run, c.row.line, {signal: ctx.signal}));
          } catch (err) {
            if (err.name === 'AbortError') return;
            replace(c.body, h('p', {class: 'error-inline'}, `outline: ${err.message}`));
          }
        }
      };
      await Promise.all(Array.from({length: OUTLINE_CONCURRENCY}, worker));
      ctx.setReady(true);
    } catch (err) {
      if (err.name !== 'AbortError') ctx.fail(err, 'group');
    }
  })();
  return {};
}

// ---- diff ----

function foldItems(ops) {
  // Runs of unchanged lines longer than 2*CONTEXT+1 keep their ends and fold the middle.
  const items = [];
  let i = 0;
  while (i < ops.length) {
    if (ops[i].op !== 'same') {
      items.push(ops[i]);
      i++;
      continue;
    }
    let j = i;
    while (j < ops.length && ops[j].op === 'same') j++;
    const keepHead = i === 0 ? 0 : CONTEXT;
    const keepTail = j === ops.length ? 0 : CONTEXT;
    if (j - i >= keepHead + keepTail + 4) { // fold at least 4 lines
      for (let k = i; k < i + keepHead; k++) items.push(ops[k]);
      items.push({fold: ops.slice(i + keepHead, j - keepTail)});
      for (let k = j - keepTail; k < j; k++) items.push(ops[k]);
    } else {
      for (let k = i; k < j; k++) items.push(ops[k]);
    }
    i = j;
  }
  return items;
}

function lineEl(o, aLines, bLines) {
  const text = o.op === 'add' ? bLines[o.b] : aLines[o.a];
  // Line numbers are drawn by CSS from data-n: a line's text is its marker and its content.
  return h('div', {class: `dl ${o.op}`, 'data-test': 'diff-line', 'data-op': o.op},
    h('span', {class: 'ln', 'data-n': o.a === null ? '' : o.a + 1, 'aria-hidden': 'true'}),
    h('span', {class: 'ln', 'data-n': o.b === null ? '' : o.b + 1, 'aria-hidden': 'true'}),
    h('span', {class: 'sign'}, o.op === 'add' ? '+' : o.op === 'del' ? '−' : ' '),
    h('span', {class: 'text'}, text));
}

function mountDiff(ctx) {
  const run = ctx.run;
  const {a, b} = ctx.route;
  const notes = h('div', {class: 'notes'});
  const summary = h('span', {class: 'diff-stats'});
  const out = h('div', {class: 'diff', 'data-test': 'diff', role: 'table', 'aria-label': 'line diff'});
  ctx.root.append(h('section', {class: 'diff-view'},
    h('header', {class: 'diff-head'},
      h('h1', null, 'Diff'),
      h('span', {class: 'side del-side'}, '− ', h('a', {href: hashOf(['run', run, 'episode', a])}, `episode ${a}`)),
      h('span', {class: 'side add-side'}, '+ ', h('a', {href: hashOf(['run', run, 'episode', b])}, `episode ${b}`)),
      h('a', {class: 'btn', href: hashOf(['run', run, 'diff', b, a])}, 'swap'),
      summary),
    notes, out));

  (async () => {
    try {
      const [ta, tb] = await Promise.all([api.text(run, a, {signal: ctx.signal}), api.text(run, b, {signal: ctx.signal})]);
      if (!ctx.isCurrent()) return;
      const aLines = splitLines(String(ta.text ?? ''));
      const bLines = splitLines(String(tb.text ?? ''));
      const t0 = performance.now();
      const {ops, truncated, gaveUp} = diffLines(aLines, bLines);
      const ms = performance.now() - t0;
      let adds = 0;
      let dels = 0;
      for (const o of ops) {
        if (o.op === 'add') adds++;
        else if (o.op === 'del') dels++;
      }
      summary.replaceChildren(h('span', {class: 'add-count'}, `+${fmtInt(adds)}`), ' ', h('span', {class: 'del-count'}, `−${fmtInt(dels)}`),
        h('span', {class: 'muted'}, ` · ${fmtInt(aLines.length)} / ${fmtInt(bLines.length)} lines · ${ms.toFixed(0)} ms`));
      const noteList = [];
      if (ta.truncated || tb.truncated) noteList.push('The server cut a transcript to its first 2 MiB; the diff covers that part only.');
      if (truncated) noteList.push(`Only the first ${fmtInt(MAX_LINES)} lines of each side are compared.`);
      if (gaveUp) noteList.push('The two differ too much to compare line by line in good time; what was left is shown as removed then added.');
      replace(notes, noteList.map((n) => h('div', {class: 'notice'}, n)));
      if (ops.length === 0) {
        replace(out, h('p', {class: 'muted'}, 'Both transcripts are empty.'));
      } else if (adds === 0 && dels === 0) {
        out.append(h('p', {class: 'muted same-note'}, 'The two transcripts are identical.'));
      }
      const items = foldItems(ops);
      let at = 0;
      const more = h('button', {type: 'button', class: 'btn more-btn', on: {click: () => renderMore()}});
      const renderMore = () => {
        more.remove();
        const frag = document.createDocumentFragment();
        let n = 0;
        while (at < items.length && n < RENDER_CHUNK) {
          const it = items[at++];
          if (it.fold) {
            const fold = h('button', {type: 'button', class: 'fold', 'data-test': 'diff-fold',
              on: {click: () => fold.replaceWith(...it.fold.map((o) => lineEl(o, aLines, bLines)))}},
            `⋯ ${fmtInt(it.fold.length)} unchanged lines`);
            frag.append(fold);
          } else {
            frag.append(lineEl(it, aLines, bLines));
          }
          n++;
        }
        out.append(frag);
        if (at < items.length) {
          more.textContent = `show ${fmtInt(Math.min(RENDER_CHUNK, items.length - at))} more of ${fmtInt(items.length - at)}`;
          out.append(more);
        }
      };
      renderMore();
      ctx.setReady(true);
    } catch (err) {
      if (err.name !== 'AbortError') ctx.fail(err, 'diff');
    }
  })();
  return {};
}
