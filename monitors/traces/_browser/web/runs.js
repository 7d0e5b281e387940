// `#/`: the runs this server serves; with one run, straight to its episode list.

import {api} from './api.js';
import {fmtInt, h, hashOf, replace} from './dom.js';

function stepsText(steps) {
  if (!steps || steps.length === 0) return '—';
  if (steps.length === 1) return `step ${steps[0]}`;
  return `${fmtInt(steps.length)} (${steps[0]}–${steps[steps.length - 1]})`;
}

export function mount(ctx) {
  const box = h('section', {class: 'runs'}, h('h1', null, 'Runs'), h('p', {class: 'muted'}, 'Loading…'));
  ctx.root.append(box);
  api.runs({signal: ctx.signal}).then((data) => {
    if (!ctx.isCurrent()) return;
    const runs = Array.isArray(data.runs) ? data.runs : [];
    if (runs.length === 1 && (location.hash === '' || location.hash === '#' || location.hash === '#/')) {
      ctx.navigate(hashOf(['run', runs[0].name]), {replace: true});
      return;
    }
    const rows = runs.map((r) => h('tr', {'data-test': 'run', 'data-run': r.name},
      h('td', {class: 'name'}, h('a', {href: hashOf(['run', r.name])}, r.name)),
      h('td', {class: 'path mono'}, r.path),
      h('td', {class: 'num'}, fmtInt(r.episodes)),
      h('td', {class: 'num'}, stepsText(r.steps)),
      h('td', {class: 'links'},
        h('a', {href: hashOf(['run', r.name])}, 'Episodes'),
        r.metrics ? h('a', {href: hashOf(['run', r.name, 'metrics'])}, 'Metrics') :
          h('span', {class: 'muted', title: 'no metrics.jsonl'}, 'no metrics'))));
    replace(box, h('h1', null, 'Runs'),
      runs.length === 0 ? h('p', {class: 'muted'}, 'This server serves no runs.') :
        h('table', {class: 'grid runs-table'},
          h('thead', null, h('tr', null,
            h('th', null, 'run'), h('th', null, 'path'), h('th', {class: 'num'}, 'episodes'),
            h('th', {class: 'num'}, 'steps'), h('th', null, ''))),
          h('tbody', null, rows)));
    ctx.setReady(true);
  }).catch((err) => {
    if (err.name === 'AbortError') return;
    replace(box, h('h1', null, 'Runs'));
    ctx.fail(err, 'runs');
  });
  return {};
}
