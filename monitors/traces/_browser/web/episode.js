// `#/run/{run}/episode/{line}[/trace/{t}/node/{n}]`: one episode, lazily.
//
// The outline (every node's role, preview and sizes) renders as collapsed headers; a node's
// body (its message and tokens) is fetched only when it is opened, so a 60 MB episode costs the
// browser its outline plus the nodes a user reads. Opening a node writes it into the hash.

import {api} from './api.js';
import {fieldList, fieldValue, fmtBytes, fmtDuration, fmtInt, fmtNum, h, hashOf, isOmitted, replace, rewardEl, shown} from './dom.js';
import {heatmap} from './tokens.js';

const ROLES = new Set(['system', 'user', 'assistant', 'tool', 'developer']);
const BLOCK = 50; // node headers per content-visibility block

function roleClass(role) {
  return ROLES.has(role) ? `role-${role}` : 'role-other';
}

/** `rewards` of a verifiers trace ({name: {score, weight}}) or a plain number, as text. */
function rewardsText(rewards) {
  if (rewards === null || rewards === undefined) return null;
  if (typeof rewards === 'number') return fmtNum(rewards);
  if (isOmitted(rewards)) return `(${fmtInt(rewards.$bytes)} bytes)`;
  if (typeof rewards !== 'object' || Array.isArray(rewards)) return JSON.stringify(rewards);
  return Object.entries(rewards).map(([name, v]) => {
    if (typeof v === 'number') return `${name} ${fmtNum(v)}`;
    if (v && typeof v === 'object' && typeof v.score === 'number') {
      return `${name} ${fmtNum(v.score)}` + (typeof v.weight === 'number' && v.weight !== 1 ? ` ×${fmtNum(v.weight)}` : '');
    }
    return `${name} ${JSON.stringify(v)}`;
  }).join(' · ');
}

function errorCount(errors) {
  if (Array.isArray(errors)) return errors.length;
  if (typeof errors === 'number') return errors;
  return 0;
}

/** Message content (a string, or a list of parts) as plain text. */
function contentText(content) {
  if (content === null || content === undefined) return '';
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content.map((part) => {
      if (typeof part === 'string') return part;
      if (part && typeof part === 'object' && typeof part.text === 'string') return part.text;
      return JSON.stringify(part, null, 2);
    }).join('\n');
  }
  return JSON.stringify(content, null, 2);
}

/** A tool call with JSON-string arguments pretty-printed. */
function toolCallText(call) {
  if (!call || typeof call !== 'object') return JSON.stringify(call);
  const copy = {...call};
  const fn = copy.function && typeof copy.function === 'object' ? {...copy.function} : null;
  const parse = (v) => {
    if (typeof v !== 'string') return v;
    try {
      return JSON.parse(v);
    } catch {
      return v;
    }
  };
  if ('arguments' in copy) copy.arguments = parse(copy.arguments);
  if (fn && 'arguments' in fn) {
    fn.arguments = parse(fn.arguments);
    copy.function = fn;
  }
  return JSON.stringify(copy, null, 2);
}

function toolCallName(call) {
  if (!call || typeof call !== 'object') return 'call';
  if (typeof call.name === 'string') return call.name;
  if (call.function && typeof call.function.name === 'string') return call.function.name;
  return 'call';
}

function stat(label, value, cls = '') {
  return h('div', {class: `stat ${cls}`}, h('span', {class: 'stat-label'}, label), h('span', {class: 'stat-value'}, value));
}

export function mount(ctx) {
  const run = ctx.run;
  const line = ctx.route.line;
  const section = h('section', {class: 'episode'}, h('p', {class: 'muted'}, `Loading episode ${line}…`));
  ctx.root.append(section);
  const nodes = new Map(); // "t:n" -> {el, body, loaded, loading}
  let outline = null;

  function nodeHash(t, n) {
    return hashOf(['run', run, 'episode', line, 'trace', t, 'node', n]);
  }

  function header(data) {
    const row = data.row || {};
    const fields = data.fields || {};
    const envField = fields.env && typeof fields.env === 'object' ? fields.env.name ?? fields.env.id : fields.env;
    const env = row.env ?? (typeof envField === 'string' ? envField : null);
    const id = typeof fields.id === 'string' ? fields.id : row.id ?? '—';
    const ok = row.ok ?? fields.ok;
    const actions = h('div', {class: 'actions'});
    if (typeof row.step === 'number') {
      actions.append(h('a', {class: 'btn', href: hashOf(['run', run], {step: row.step})}, `step ${row.step} episodes`));
    }
    if (row.group !== null && row.group !== undefined && row.group !== '') {
      actions.append(h('button', {type: 'button', class: 'btn', title: `group ${row.group}`,
        on: {click: () => ctx.navigate(hashOf(['run', run, 'group', String(row.group)]))}}, 'compare group'));
    }
    const tokens = row.tokens ?? null;
    return h('header', {class: 'ep-header'},
      h('div', {class: 'ep-title'},
        h('h1', null, `Episode ${line}`),
        ok === false ? h('span', {class: 'badge bad'}, 'failed') : ok === true ? h('span', {class: 'badge good'}, 'ok') : null,
        row.kind ? h('span', {class: 'badge'}, row.kind) : null,
        env ? h('span', {class: 'badge env', title: String(env)}, String(env)) : null,
        h('span', {class: 'muted ms'}, `${fmtBytes(data.bytes)} · outline ${fmtInt(data.ms ?? 0)} ms`),
        actions),
      h('div', {class: 'stats'},
        stat('reward', rewardEl(row.reward)),
        stat('advantage', fmtNum(row.advantage, 4)),
        stat('step', fmtInt(row.step)),
        stat('tokens', tokens === null ? '—' : `${fmtInt(tokens)}`, 'wide'),
        stat('in / out', `${fmtInt(row.input_tokens)} / ${fmtInt(row.output_tokens)}`, 'wide'),
        stat('turns', fmtInt(row.turns)),
        stat('errors', fmtInt(row.errors), row.errors > 0 ? 'bad' : ''),
        stat('duration', fmtDuration(row.duration)),
        stat('line', fmtInt(line))),
      h('div', {class: 'ids mono'},
        h('span', {title: String(id)}, h('span', {class: 'muted'}, 'id '), String(id)),
        row.group ? h('span', {title: String(row.group)}, h('span', {class: 'muted'}, 'group '), String(row.group)) : null),
      h('details', {class: 'record-fields'},
        h('summary', null, `record fields (${Object.keys(fields).length})`),
        fieldList(fields)));
  }

  function nodeEl(t, node) {
    const n = node.index;
    const badges = [];
    if (node.error) badges.push(h('span', {class: 'badge bad', title: 'this node has an error'}, 'error'));
    if (node.tool_calls > 0) badges.push(h('span', {class: 'badge tool', title: 'tool calls'}, `${node.tool_calls} call${node.tool_calls > 1 ? 's' : ''}`));
    if (node.sampled) badges.push(h('span', {class: 'badge sampled', title: 'sampled from the model'}, 'sampled'));
    const parents = Array.isArray(node.parents) ? node.parents : null;
    // A branch: parents other than the node before (an empty list says nothing).
    if (parents && parents.length > 0 && !(parents.length === 1 && parents[0] === n - 1)) {
      badges.push(h('span', {class: 'badge branch', title: `parents: ${parents.join(', ')}`}, `↳ ${parents.join(',')}`));
    }
    const head = h('div', {class: 'node-head', role: 'button', tabindex: 0, 'aria-expanded': 'false'},
      h('span', {class: 'caret', 'aria-hidden': 'true'}),
      h('span', {class: 'idx mono'}, `#${n}`),
      h('span', {class: `role ${roleClass(node.role)}`}, String(node.role ?? '?')),
      h('span', {class: 'preview'}, String(node.preview ?? '')),
      badges,
      h('span', {class: 'meta mono', title: `${fmtInt(node.chars)} chars, ${fmtInt(node.bytes)} bytes`},
        `${fmtInt(node.tokens)} tok`));
    return h('div', {
      class: `node ${roleClass(node.role)}${node.error ? ' has-error' : ''}`,
      'data-test': 'node', 'data-trace': t, 'data-node': n,
    }, head);
  }

  function traceEl(trace, ti) {
    const t = Number.isInteger(trace.index) ? trace.index : ti;
    const f = trace.fields || {};
    const nodeList = Array.isArray(trace.nodes) ? trace.nodes : [];
    const errs = errorCount(f.errors);
    const rewards = rewardsText(f.rewards ?? f.reward);
    // Headers in blocks the browser skips laying out and painting while off screen
    // (content-visibility): thousands of nodes cost what a screenful does.
    const box = h('div', {class: 'nodes', role: 'list'});
    const frag = document.createDocumentFragment();
    let block = null;
    for (const [k, node] of nodeList.entries()) {
      if (k % BLOCK === 0) {
        block = h('div', {class: 'node-block'});
        block.style.setProperty('--block-h', `${Math.min(BLOCK, nodeList.length - k) * 29}px`);
        frag.append(block);
      }
      const el = nodeEl(t, node);
      nodes.set(`${t}:${node.index}`, {el, t, n: node.index, body: null, loaded: false, loading: null});
      block.append(el);
    }
    box.append(frag);
    const agent = trace.agent ?? (f.agent && typeof f.agent === 'object' ? f.agent.name : null);
    return h('section', {class: 'trace', 'data-test': 'trace', 'data-trace': t},
      h('header', {class: 'trace-head'},
        h('h2', null, `Trace ${t}`, agent ? h('span', {class: 'agent'}, String(agent)) : null),
        h('span', {class: 'muted'}, `${fmtInt(nodeList.length)} nodes`),
        rewards ? h('span', {class: 'rewards', title: 'rewards'}, h('span', {class: 'muted'}, 'rewards '), rewards) : null,
        f.stop_condition !== undefined ? h('span', {class: 'stop'}, h('span', {class: 'muted'}, 'stop '), fieldValue(f.stop_condition)) : null,
        errs > 0 ? h('span', {class: 'badge bad'}, `${errs} error${errs > 1 ? 's' : ''}`) : null,
        h('span', {class: 'trace-id mono muted', title: String(trace.id ?? '')}, String(trace.id ?? ''))),
      h('details', {class: 'trace-fields'}, h('summary', null, 'trace fields'), fieldList(f)),
      box);
  }

  function bodyOf(data) {
    const msg = data.message || {};
    const parts = [];
    const fields = data.fields && typeof data.fields === 'object' ? data.fields : {};
    const extra = Object.fromEntries(Object.entries(msg).filter(([k]) => !['role', 'content', 'reasoning_content', 'tool_calls'].includes(k)));
    const meta = {...extra, ...fields};
    if (Object.keys(meta).length) parts.push(h('div', {class: 'node-fields'}, fieldList(meta)));
    if (data.truncated) parts.push(h('div', {class: 'notice'}, 'The content is cut to its first 1 MiB of characters.'));
    const reasoning = msg.reasoning_content;
    if (reasoning !== null && reasoning !== undefined && reasoning !== '') {
      const text = contentText(reasoning);
      const pre = h('pre', {class: 'reasoning'});
      const det = h('details', {class: 'reasoning-box', on: {toggle: () => { if (det.open && !pre.firstChild) pre.textContent = shown(text); }}},
        h('summary', null, `reasoning · ${fmtInt(text.length)} chars`), pre);
      parts.push(det);
    }
    const text = contentText(msg.content);
    parts.push(h('pre', {class: `content${text === '' ? ' empty' : ''}`, 'data-test': 'node-content'}, text));
    const calls = Array.isArray(msg.tool_calls) ? msg.tool_calls : [];
    if (calls.length) {
      parts.push(h('div', {class: 'tool-calls'}, calls.map((call) =>
        h('div', {class: 'tool-call'},
          h('div', {class: 'tool-call-head'}, h('span', {class: 'badge tool'}, 'tool call'), h('span', {class: 'mono'}, toolCallName(call))),
          h('pre', {class: 'json'}, toolCallText(call))))));
    }
    const tokens = data.tokens;
    if (tokens && Number(tokens.count) > 0) parts.push(heatmap(tokens));
    return parts;
  }

  async function open(state, {scroll = false, writeHash = true} = {}) {
    const {el, t, n} = state;
    const head = el.firstChild;
    el.classList.add('open');
    head.setAttribute('aria-expanded', 'true');
    if (!state.body) {
      state.body = h('div', {class: 'node-body'}, h('p', {class: 'muted'}, 'Loading…'));
      el.append(state.body);
    }
    state.body.hidden = false;
    if (writeHash) ctx.setHash(nodeHash(t, n));
    if (scroll) el.scrollIntoView({block: 'start'});
    if (!state.loaded) {
      if (!state.loading) {
        state.loading = api.node(run, line, t, n, {signal: ctx.signal}).then((data) => {
          state.loaded = true;
          replace(state.body, bodyOf(data));
        }).catch((err) => {
          state.loading = null;
          if (err.name === 'AbortError') throw err;
          replace(state.body, h('p', {class: 'error-inline'}, `Could not load this node: ${err.message}`));
          throw err;
        });
      }
      await state.loading;
      if (scroll) el.scrollIntoView({block: 'start'});
    }
  }

  function close(state) {
    state.el.classList.remove('open');
    state.el.firstChild.setAttribute('aria-expanded', 'false');
    if (state.body) state.body.hidden = true;
    const r = ctx.route;
    if (r.trace === state.t && r.node === state.n) ctx.setHash(hashOf(['run', run, 'episode', line]));
  }

  function toggle(state) {
    if (state.el.classList.contains('open')) close(state);
    else open(state).catch((err) => ctx.fail(err, `node ${state.t}/${state.n}`));
  }

  function onClick(ev) {
    const el = ev.target.closest('[data-test=node]');
    if (!el || !section.contains(el)) return;
    // Clicks inside an opened body (selecting text, the heatmap) do not fold it.
    if (ev.target.closest('.node-body')) return;
    const state = nodes.get(`${el.dataset.trace}:${el.dataset.node}`);
    if (state) toggle(state);
  }

  function onKey(ev) {
    if ((ev.key === 'Enter' || ev.key === ' ') && ev.target.classList.contains('node-head')) {
      ev.preventDefault();
      onClick(ev);
    }
  }

  async function goTo(route) {
    if (route.trace === null || route.node === null) {
      ctx.setReady(true);
      return;
    }
    const state = nodes.get(`${route.trace}:${route.node}`);
    if (!state) {
      ctx.fail(new Error(`episode ${line} has no node ${route.node} in trace ${route.trace}`), 'episode');
      return;
    }
    try {
      await open(state, {scroll: true, writeHash: false});
      ctx.setReady(true);
    } catch (err) {
      ctx.fail(err, `node ${route.trace}/${route.node}`);
    }
  }

  api.outline(run, line, {signal: ctx.signal}).then((data) => {
    if (!ctx.isCurrent()) return;
    outline = data;
    const traces = Array.isArray(data.traces) ? data.traces : [];
    replace(section, header(data),
      traces.length ? traces.map(traceEl) : h('p', {class: 'muted'}, 'This episode has no traces.'));
    section.addEventListener('click', onClick);
    section.addEventListener('keydown', onKey);
    goTo(ctx.route);
  }).catch((err) => {
    if (err.name === 'AbortError') return;
    replace(section, h('h1', null, `Episode ${line}`));
    ctx.fail(err, `episode ${line}`);
  });

  return {
    update(route) {
      if (!outline) return; // the outline's arrival handles the route
      goTo(route);
    },
  };
}
