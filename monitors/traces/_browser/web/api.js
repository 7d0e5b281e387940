// The server's JSON API (same origin only), and the page's one error banner.

export class ApiError extends Error {
  constructor(message, {code = 'error', status = 0} = {}) {
    super(message);
    this.name = 'ApiError';
    this.code = code;
    this.status = status;
  }
}

const run = (name) => `/api/runs/${encodeURIComponent(name)}`;

function query(params) {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== null && v !== undefined && v !== '') qs.set(k, String(v));
  }
  const text = qs.toString();
  return text ? '?' + text : '';
}

/** GET a JSON document; a non-2xx answer throws an ApiError with the server's message. */
export async function getJSON(path, {signal} = {}) {
  let resp;
  try {
    resp = await fetch(path, {signal, headers: {Accept: 'application/json'}, credentials: 'same-origin'});
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    throw new ApiError(`cannot reach the server (${err.message})`, {code: 'network'});
  }
  let body = null;
  try {
    body = await resp.json();
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    if (resp.ok) throw new ApiError(`${path}: the answer is not JSON`, {code: 'bad_json', status: resp.status});
  }
  if (!resp.ok) {
    const e = body && body.error;
    const message = e && typeof e.message === 'string' ? e.message : `${resp.status} ${resp.statusText}`;
    throw new ApiError(message, {code: e && typeof e.code === 'string' ? e.code : 'http', status: resp.status});
  }
  return body;
}

export const api = {
  runs: (opts) => getJSON('/api/runs', opts),
  episodes: (name, params, opts) => getJSON(`${run(name)}/episodes${query(params)}`, opts),
  metrics: (name, opts) => getJSON(`${run(name)}/metrics`, opts),
  status: (name, opts) => getJSON(`${run(name)}/status`, opts),
  outline: (name, line, opts) => getJSON(`${run(name)}/episodes/${Number(line)}`, opts),
  node: (name, line, t, n, opts) =>
    getJSON(`${run(name)}/episodes/${Number(line)}/traces/${Number(t)}/nodes/${Number(n)}`, opts),
  text: (name, line, opts) => getJSON(`${run(name)}/episodes/${Number(line)}/text`, opts),
};

/** Show an error in the banner (`[data-test=error]`); aborted requests are not errors. */
export function showError(err, context = '') {
  if (err && err.name === 'AbortError') return;
  const box = document.querySelector('[data-test=error]');
  if (!box) return;
  const message = err instanceof Error ? err.message : String(err);
  const code = err && err.code ? ` [${err.code}]` : '';
  box.textContent = (context ? context + ': ' : '') + message + code;
  box.hidden = false;
  console.warn('nodewise:', context, err);
}

export function clearError() {
  const box = document.querySelector('[data-test=error]');
  if (box) {
    box.textContent = '';
    box.hidden = true;
  }
}
