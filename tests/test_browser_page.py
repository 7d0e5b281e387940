"""``nodewise traces serve`` in a real browser: Debian's headless Chromium, driven over the
DevTools protocol (``helpers/cdp.py``), against the real server started as a user starts it
(``python -m monitors.traces serve RUN ... --port 0``) on runs a real ``FileMonitor`` wrote
(``browser_runs.py``).

What a user does, a test does: it opens a URL, clicks with real mouse events, picks in a
``<select>``, scrolls; then checks what the page shows against what it counts itself from the
runs' index rows and records. Every test also fails on an uncaught exception, a console
error or a CSP violation the page caused (the ``page`` fixture).

With ``NODEWISE_SCREENSHOTS=DIR`` each view's test saves a 1280x800 screenshot into ``DIR``
(``browser-list.png``, ...): ``docs/browser.md`` shows them.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import anyio
import orjson
import pytest
from browser_runs import (
    HOSTILE,
    IMG,
    JS_URL,
    LONG_TOKENS,
    SCRIPT,
    UNBROKEN,
    WIDE_ROWS,
    Runs,
    append_live,
    build_runs,
)
from helpers.cdp import Chromium

from monitors.traces import read_record

pytestmark = pytest.mark.anyio

#: Seconds a view may take to show (the 60 MB episode's outline included, on a busy machine).
VIEW_TIMEOUT = 60.0
#: What the browser may fetch in all to show the 60 MB episode and one of its nodes.
EPISODE_BUDGET = 4_000_000
#: Response headers every answer carries (the contract's CSP, word for word).
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the module: the browser lives across its tests."""
    return "asyncio"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The test runs, written once for the module (~2 s: the 60 MB episode among them)."""
    return build_runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def server(runs: Runs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of ``python -m monitors.traces serve`` over the four runs, started as a
    subprocess as a user starts it (its first line of output names the URL)."""
    log = tmp_path_factory.mktemp("serve") / "stderr.log"
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "monitors.traces",
                "serve",
                str(runs.train),
                str(runs.big),
                str(runs.hostile),
                str(runs.live),
                str(runs.wide),
                "--port",
                "0",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    assert process.stdout is not None
    lines: queue.Queue[bytes] = queue.Queue()
    drain = threading.Thread(target=_drain, args=(process.stdout, lines), daemon=True)
    drain.start()
    try:
        try:
            first = lines.get(timeout=30).decode()
        except queue.Empty:
            first = ""
        found = re.fullmatch(r"serving (http://127\.0\.0\.1:\d+/)\n", first)
        assert found, f"first line {first!r}; stderr: {log.read_text(errors='replace')[-3000:]}"
        yield found[1]
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        drain.join(timeout=10)
        process.stdout.close()
    errors = log.read_text(errors="replace")
    assert "Traceback" not in errors, f"the server logged a traceback:\n{errors[-5000:]}"


def _drain(stream: Any, lines: queue.Queue[bytes]) -> None:
    """Read the server's output to its end (so that it never blocks on a full pipe)."""
    for line in stream:
        lines.put(line)


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Chromium]:
    """One headless Chromium for the module (a fresh profile, 1280x800)."""
    async with Chromium(width=1280, height=800) as chromium:
        yield chromium


@pytest.fixture
async def page(browser: Chromium) -> AsyncIterator[Chromium]:
    """The browser, its records cleared; after the test, nothing the page reported may be
    an error (an uncaught exception, ``console.error``, a failed load, a CSP violation)."""
    await browser.navigate("about:blank")
    browser.clear_messages()
    browser.clear_network()
    yield browser
    errors = browser.errors()
    assert not errors, "the page reported errors:\n" + "\n".join(errors)


# -- helpers ----------------------------------------------------------------------------------


def index_rows(run: Path) -> list[dict[str, Any]]:
    """A run's index rows, read here (not through the server)."""
    index = run / "monitors" / "file" / "traces" / "stream.index.jsonl"
    return [orjson.loads(line) for line in index.read_bytes().splitlines()]


def lines_where(rows: list[dict[str, Any]], keep: Callable[[dict[str, Any]], bool]) -> set[int]:
    return {row["line"] for row in rows if keep(row)}


async def screenshot(page: Chromium, name: str) -> None:
    """Save the viewport as ``NAME`` into ``$NODEWISE_SCREENSHOTS`` (when set)."""
    folder = os.environ.get("NODEWISE_SCREENSHOTS")
    if folder:
        await page.evaluate("new Promise(r => requestAnimationFrame(() => setTimeout(r, 50)))")
        await page.screenshot(Path(folder) / name)


async def wait_ready(page: Chromium, view: str, *, timeout: float = VIEW_TIMEOUT) -> None:
    """Wait until the page shows ``view`` with its data rendered, and no error."""
    await page.wait_for(
        f"document.documentElement.dataset.view === {json.dumps(view)}"
        " && document.documentElement.dataset.ready === '1'",
        timeout=timeout,
    )
    shown = await page.evaluate(
        "[...document.querySelectorAll('[data-test=error]')]"
        ".map(e => e.textContent.trim()).filter(Boolean)"
    )
    assert not shown, f"the page shows an error: {shown}"


async def goto(page: Chromium, server: str, route: str, view: str) -> None:
    """Load the page afresh at ``#route`` (as a typed or bookmarked URL) and wait for
    ``view``."""
    await page.navigate("about:blank")
    await page.navigate(f"{server}#{route}")
    await wait_ready(page, view)


async def matched(page: Chromium) -> int:
    """The matched count the list shows."""
    text = await page.evaluate("document.querySelector('[data-test=matched]').textContent")
    digits = re.sub(r"[^\d]", "", text)
    assert digits, f"no count in {text!r}"
    return int(digits)


async def wait_matched(page: Chromium, expected: int) -> None:
    """Wait until the list shows ``expected`` matched rows (a timeout names the last)."""
    condition = (
        "(() => { const e = document.querySelector('[data-test=matched]');"
        " return e !== null && document.documentElement.dataset.ready === '1'"
        f" && e.textContent.replace(/[^0-9]/g, '') === '{expected}'; }})()"
    )
    try:
        await page.wait_for(condition, timeout=15)
    except TimeoutError:
        pytest.fail(f"matched count: expected {expected}, the page shows {await matched(page)}")


#: The lines of the list's rows that are in view, top to bottom.
VISIBLE_ROWS = """(() => {
  const box = document.querySelector('[data-test=episode-list]').getBoundingClientRect();
  return [...document.querySelectorAll('[data-test=episode-row]')]
    .map(r => [r.getBoundingClientRect(), Number(r.dataset.line)])
    .filter(([b]) => b.height > 0 && b.bottom > box.top + 1 && b.top < box.bottom - 1)
    .sort((a, b) => a[0].top - b[0].top)
    .map(([, line]) => line);
})()"""


async def visible_lines(page: Chromium) -> list[int]:
    lines: list[int] = await page.evaluate(VISIBLE_ROWS)
    return lines


def node_selector(trace: int, node: int) -> str:
    return f'[data-test=node][data-trace="{trace}"][data-node="{node}"]'


def node_js(trace: int, node: int) -> str:
    """A JS expression: the element of node ``(trace, node)``."""
    return f"document.querySelector({json.dumps(node_selector(trace, node))})"


def content_js(trace: int, node: int) -> str:
    """A JS expression: the node's opened content, or null."""
    return f"({node_js(trace, node)}?.querySelector('[data-test=node-content]') ?? null)"


def in_view_js(trace: int, node: int) -> str:
    """A JS expression: the node is opened and its header is in the viewport."""
    return (
        f"(() => {{ const el = {node_js(trace, node)}; const c = {content_js(trace, node)};"
        " if (!el || !c) return false; const r = el.getBoundingClientRect();"
        " return r.top < innerHeight && r.bottom > 0 && r.top >= -r.height; })()"
    )


async def api(server: str, path: str) -> Any:
    """The server's JSON answer at ``path`` (for what the page is checked against)."""
    async with aiohttp.ClientSession() as session, session.get(server + path) as response:
        assert response.status == 200, (path, response.status, await response.text())
        return await response.json()


def node_requests(page: Chromium) -> list[str]:
    """URLs of the node requests the page made (``.../traces/T/nodes/N``)."""
    return [r.url for r in page.requests.values() if re.search(r"/traces/\d+/nodes/\d+", r.url)]


# -- the episode list -------------------------------------------------------------------------


async def test_list_shows_every_episode_and_scrolls_to_the_last(
    page: Chromium, server: str, runs: Runs
) -> None:
    rows = index_rows(runs.train)
    await goto(page, server, "/run/train", "list")
    assert await matched(page) == len(rows) == 200
    first = await visible_lines(page)
    assert first[:3] == [1, 2, 3], first  # in the run's order by default
    rendered = await page.evaluate("document.querySelectorAll('[data-test=episode-row]').length")
    assert len(first) <= rendered < len(rows), "the list is not virtualized"
    await screenshot(page, "browser-list.png")

    bottom = await page.evaluate("document.querySelector('[data-test=episode-list]').scrollHeight")
    await page.scroll("[data-test=episode-list]", bottom)
    try:
        await page.wait_for(f"({VISIBLE_ROWS}).includes({len(rows)})", timeout=10)
    except TimeoutError:
        pytest.fail(f"scrolled to the bottom, the rows in view are {await visible_lines(page)}")
    last = await visible_lines(page)
    assert last == list(range(last[0], len(rows) + 1)), last


async def test_a_list_of_100000_episodes_scrolls_anywhere(
    page: Chromium, server: str, runs: Runs
) -> None:
    """A run of 100,000 index rows, best reward first: the page holds a window of rows,
    and a jump to the middle or the end shows the rows there, in order."""
    rows = index_rows(runs.wide)
    order = sorted(
        rows, key=lambda r: (r["reward"] is None, -(r["reward"] or 0), r["line"])
    )  # rows without a reward last, ties in line order
    await goto(page, server, "/run/wide?sort=-reward", "list")
    assert await matched(page) == len(rows) == WIDE_ROWS
    rendered = await page.evaluate("document.querySelectorAll('[data-test=episode-row]').length")
    assert rendered < 200, f"{rendered} rows in the page: the list is not virtualized"
    height = await page.evaluate("document.querySelector('[data-test=episode-list]').scrollHeight")
    want = [r["line"] for r in order]
    place = {line: at for at, line in enumerate(want)}
    for fraction in (0.5, 1.0):
        await page.scroll("[data-test=episode-list]", int(height * fraction))
        deadline = time.monotonic() + 15
        while True:  # until the rows there are fetched and drawn
            shown = await visible_lines(page)
            at = place.get(shown[0], -1) if len(shown) > 5 else -1
            if at > len(want) * fraction - 100 or time.monotonic() > deadline:
                break
            await anyio.sleep(0.1)
        assert at > len(want) * fraction - 100, f"at {fraction:.0%} the rows in view: {shown}"
        assert shown == want[at : at + len(shown)], shown
        rendered = await page.evaluate(
            "document.querySelectorAll('[data-test=episode-row]').length"
        )
        assert rendered < 200
    assert shown[-1] == want[-1]  # the end: the last row without a reward


async def test_list_sorts_by_reward(page: Chromium, server: str, runs: Runs) -> None:
    reward = {row["line"]: row["reward"] for row in index_rows(runs.train)}
    ascending = sorted(reward.values())
    await goto(page, server, "/run/train", "list")
    orders = []
    for _ in range(2):  # a click sorts by reward, the next reverses it
        before = await page.evaluate("location.hash")
        await page.click("[data-test=sort][data-column=reward]")
        await page.wait_for(
            f"location.hash !== {json.dumps(before)} && /[?&]sort=-?reward/.test(location.hash)"
            " && document.documentElement.dataset.ready === '1'",
            timeout=15,
        )
        descending = "sort=-reward" in await page.evaluate("location.hash")
        want = ascending[::-1] if descending else ascending
        deadline = time.monotonic() + 10
        while True:  # until the rows in view are redrawn in the new order (or time is up)
            shown = [reward[line] for line in await visible_lines(page)]
            if (shown and shown == want[: len(shown)]) or time.monotonic() > deadline:
                break
            await anyio.sleep(0.05)
        assert len(shown) >= 10, shown
        assert shown == want[: len(shown)], (
            f"{'descending' if descending else 'ascending'}: the rows' rewards are {shown}, "
            f"expected {want[: len(shown)]}"
        )
        orders.append(descending)
    assert orders[0] != orders[1], "a second click did not reverse the order"


@pytest.mark.parametrize(
    ("control", "value", "keep"),
    [
        ("kind", "eval", lambda row: row["kind"] == "eval"),
        ("env", "wiki", lambda row: row["env"] == "wiki"),
        ("errors", "yes", lambda row: row["num_errors"] > 0),
        ("errors", "no", lambda row: row["num_errors"] == 0),
        ("step", "2", lambda row: row["step"] == 2),
    ],
    ids=["kind", "env", "errors-yes", "errors-no", "step"],
)
async def test_list_filters(
    page: Chromium,
    server: str,
    runs: Runs,
    control: str,
    value: str,
    keep: Callable[[dict[str, Any]], bool],
) -> None:
    rows = index_rows(runs.train)
    want = lines_where(rows, keep)
    assert 0 < len(want) < len(rows)
    await goto(page, server, "/run/train", "list")
    await page.select(f"select[name={control}]", value)
    await wait_matched(page, len(want))
    assert f"{control}={value}" in await page.evaluate("location.hash"), "not in the URL"
    shown = await visible_lines(page)
    assert shown, "no rows in view"
    assert set(shown) <= want, f"rows that do not match: {sorted(set(shown) - want)}"
    assert shown == sorted(want)[: len(shown)]


async def test_histogram_bin_filters_to_its_rewards(
    page: Chromium, server: str, runs: Runs
) -> None:
    rows = index_rows(runs.train)
    histogram = (await api(server, "api/runs/train/episodes?limit=1"))["histogram"]
    edges, counts = histogram["edges"], histogram["counts"]
    i = max(range(len(counts)), key=lambda k: counts[k])
    lo, hi = edges[i], edges[i + 1]
    last = i == len(counts) - 1
    want = lines_where(
        rows,
        lambda row: (
            row["reward"] is not None
            and lo <= row["reward"]
            and (row["reward"] <= hi if last else row["reward"] < hi)
        ),
    )
    assert len(want) == counts[i], (len(want), counts[i])
    assert 0 < len(want) < len(rows)
    await goto(page, server, "/run/train", "list")
    await page.click(f"[data-test=bin][data-index='{i}']")
    await wait_matched(page, len(want))
    shown = await visible_lines(page)
    assert shown
    assert set(shown) <= want, sorted(set(shown) - want)
    await page.click(f"[data-test=bin][data-index='{i}']")  # again: the filter goes
    await wait_matched(page, len(rows))


async def test_list_state_is_in_the_url(page: Chromium, server: str, runs: Runs) -> None:
    """A list's sort and filters come back from its URL (a bookmark, a reload)."""
    rows = index_rows(runs.train)
    want = lines_where(rows, lambda row: row["kind"] == "train" and row["step"] == 3)
    rewards = sorted((row["reward"] for row in rows if row["line"] in want), reverse=True)
    await goto(page, server, "/run/train?sort=-reward&kind=train&step=3", "list")
    await wait_matched(page, len(want))
    controls = await page.evaluate(
        "['kind', 'step'].map(n => document.querySelector(`select[name=${n}]`).value)"
    )
    assert controls == ["train", "3"]
    shown = await visible_lines(page)
    assert shown, "no rows in view"
    assert set(shown) <= want
    reward = {row["line"]: row["reward"] for row in rows}
    assert [reward[line] for line in shown] == rewards[: len(shown)]


async def test_new_episodes_appear_while_the_run_writes(
    page: Chromium, server: str, runs: Runs
) -> None:
    before = len(index_rows(runs.live))
    await goto(page, server, "/run/live", "list")
    assert await matched(page) == before
    await append_live(runs.live, 3)
    await wait_matched(page, before + 3)  # without a reload: the page polls the run
    await page.wait_for(f"({VISIBLE_ROWS}).includes({before + 3})", timeout=10)


# -- metrics ----------------------------------------------------------------------------------


async def test_metrics_plot_each_metric_and_a_step_lists_its_episodes(
    page: Chromium, server: str, runs: Runs
) -> None:
    await goto(page, server, "/run/train/metrics", "metrics")
    plots = await page.evaluate(
        "[...document.querySelectorAll('[data-test=plot]')]"
        ".map(p => [p.dataset.metric, !!p.querySelector('svg'),"
        " p.querySelectorAll('[data-test=step-point]').length])"
    )
    assert sorted(p[0] for p in plots) == sorted(runs.metrics), plots
    assert all(has_svg for _, has_svg, _ in plots), plots
    assert all(points >= 5 for _, _, points in plots), plots  # a point per step
    await screenshot(page, "browser-metrics.png")

    want = lines_where(index_rows(runs.train), lambda row: row["step"] == 2)
    await page.click("[data-test=step-point][data-step='2']")
    await wait_ready(page, "list")
    await wait_matched(page, len(want))
    assert re.search(r"[?&]step=2(&|$)", await page.evaluate("location.hash"))
    shown = await visible_lines(page)
    assert shown
    assert set(shown) <= want


# -- one episode, lazily ----------------------------------------------------------------------


async def test_60mb_episode_opens_node_by_node(page: Chromium, server: str, runs: Runs) -> None:
    assert 58_000_000 < runs.big_bytes < 62_000_000
    assert sum(runs.big_nodes) >= 600
    started = time.monotonic()
    await goto(page, server, f"/run/big/episode/{runs.big_line}", "episode")
    opened = time.monotonic() - started
    per_trace = await page.evaluate(
        "(() => { const n = {}; for (const e of document.querySelectorAll('[data-test=node]'))"
        " n[e.dataset.trace] = (n[e.dataset.trace] || 0) + 1; return n; })()"
    )
    assert per_trace == {str(t): n for t, n in enumerate(runs.big_nodes)}
    await screenshot(page, "browser-episode.png")  # its head and outline, as it opens

    trace, node = runs.probe  # the 500th node: scroll to it, open it
    await page.evaluate(f"{node_js(trace, node)}.scrollIntoView({{block: 'center'}})")
    await page.click(node_selector(trace, node))
    await page.wait_for(in_view_js(trace, node), timeout=15)
    text = await page.evaluate(f"{content_js(trace, node)}.textContent")
    assert shown(runs.probe_text[:100]) in text
    header = await page.evaluate(f"{node_js(trace, node)}.textContent")
    assert runs.probe_role in header

    # Only the outline and that one node came over the network: a few hundred kB, not 60 MB.
    deadline = time.monotonic() + 5  # every answer in (a status poll may be under way)
    while not all(r.finished for r in page.requests.values()) and time.monotonic() < deadline:
        await anyio.sleep(0.05)
    nodes = node_requests(page)
    assert len(nodes) == 1, nodes
    assert nodes[0].endswith(f"/traces/{trace}/nodes/{node}"), nodes
    assert all(r.finished for r in page.requests.values()), [
        r.url for r in page.requests.values() if not r.finished
    ]
    fetched = sum(r.encoded_bytes for r in page.requests.values())
    assert fetched < EPISODE_BUDGET, f"fetched {fetched} bytes for the episode"
    assert not [r.url for r in page.requests.values() if r.url.endswith("/text")]
    heap = await page.evaluate("performance.memory ? performance.memory.usedJSHeapSize : 0")
    assert heap < 40_000_000, f"the page holds {heap} bytes of JS heap"
    print(
        f"60 MB episode: shown in {opened:.2f} s, {fetched} bytes fetched "
        f"({len(page.requests)} requests), JS heap {heap} bytes"
    )


async def test_deep_link_reloads_to_the_same_node(page: Chromium, server: str, runs: Runs) -> None:
    trace, node = runs.probe
    route = f"/run/big/episode/{runs.big_line}/trace/{trace}/node/{node}"
    await goto(page, server, route, "episode")
    await page.wait_for(in_view_js(trace, node), timeout=15)
    await page.reload()
    await wait_ready(page, "episode")
    try:
        await page.wait_for(in_view_js(trace, node), timeout=15)
    except TimeoutError:
        pytest.fail("after a reload the deep-linked node is not opened and in view")
    assert await page.evaluate("location.hash") == "#" + route
    text = await page.evaluate(f"{content_js(trace, node)}.textContent")
    assert shown(runs.probe_text[:100]) in text
    opened = await page.evaluate("document.querySelectorAll('[data-test=node-content]').length")
    assert opened == 1, f"{opened} nodes opened, not only the linked one"


# -- the heatmap ------------------------------------------------------------------------------

#: The heatmap of a node, read back: tokens drawn, token count, and its canvas's pixels
#: (how many are not transparent, how many colours, a checksum of them all).
HEATMAP = """(() => {
  const map = %s?.querySelector('[data-test=heatmap]');
  const canvas = map?.querySelector('canvas');
  if (!map || !canvas || !canvas.width || !canvas.height) return null;
  const copy = document.createElement('canvas');
  copy.width = canvas.width; copy.height = canvas.height;
  const ctx = copy.getContext('2d');
  ctx.drawImage(canvas, 0, 0);
  const px = ctx.getImageData(0, 0, copy.width, copy.height).data;
  let opaque = 0, sum = 0;
  const colours = new Set();
  for (let i = 0; i < px.length; i += 4) {
    if (px[i + 3] === 0) continue;
    opaque++;
    const c = (px[i] << 16) | (px[i + 1] << 8) | px[i + 2];
    colours.add(c);
    sum = (sum * 31 + c + i) %% 1000000007;
  }
  return {drawn: Number(map.dataset.drawn), count: Number(map.dataset.count),
          opaque, colours: colours.size, sum, width: copy.width, height: copy.height};
})()"""

#: The heatmap's scrolling element (itself or inside it), marked for ``Chromium.scroll``.
SCROLLER = """(() => {
  const map = %s.querySelector('[data-test=heatmap]');
  const el = [map, ...map.querySelectorAll('*')].find(e =>
    e.scrollHeight > e.clientHeight + 1 && /auto|scroll/.test(getComputedStyle(e).overflowY));
  if (!el) return null;
  el.dataset.testScroller = '1';
  return [el.scrollHeight, el.clientHeight];
})()"""


async def test_heatmap_draws_a_window_of_a_long_node(
    page: Chromium, server: str, runs: Runs
) -> None:
    trace, node = runs.long_node
    await goto(
        page, server, f"/run/big/episode/{runs.long_line}/trace/{trace}/node/{node}", "episode"
    )
    heatmap = HEATMAP % node_js(trace, node)
    try:
        first = await page.wait_for(
            f"(() => {{ const h = {heatmap}; return h && h.drawn > 0 && h.opaque > 0 && h; }})()",
            timeout=15,
        )
    except TimeoutError:
        pytest.fail(f"the long node shows no drawn heatmap: {await page.evaluate(heatmap)}")
    assert first["count"] == LONG_TOKENS >= 32_768
    assert 0 < first["drawn"] < first["count"], first
    assert first["opaque"] > 1000, first  # drawn, not blank
    assert first["colours"] > 2, first
    await page.evaluate(
        f"{node_js(trace, node)}.querySelector('[data-test=heatmap]')"
        ".scrollIntoView({block: 'end'})"
    )
    await screenshot(page, "browser-heatmap.png")

    size = await page.evaluate(SCROLLER % node_js(trace, node))
    assert size is not None, "nothing in the heatmap scrolls"
    await page.scroll("[data-test-scroller]", size[0] * 0.75)
    try:
        moved = await page.wait_for(
            f"(() => {{ const h = {heatmap}; return h && h.sum !== {first['sum']} && h; }})()",
            timeout=10,
        )
    except TimeoutError:
        pytest.fail("scrolling the heatmap did not change what it draws")
    assert 0 < moved["drawn"] < moved["count"], moved
    assert moved["opaque"] > 1000, moved

    before = moved["sum"]
    await page.select("select[name=overlay]", "advantages")
    try:
        await page.wait_for(
            f"(() => {{ const h = {heatmap}; return h && h.sum !== {before}; }})()", timeout=10
        )
    except TimeoutError:
        pytest.fail("choosing the advantages overlay did not change the colours")


# -- comparing rollouts -----------------------------------------------------------------------


def _a_group(runs: Runs) -> tuple[str, list[int]]:
    """A train group of step 1 and its lines."""
    groups: dict[str, list[int]] = defaultdict(list)
    for row in index_rows(runs.train):
        if row["step"] == 1 and row["kind"] == "train":
            groups[row["group"]].append(row["line"])
    group, lines = next(iter(groups.items()))
    assert len(lines) >= 4
    return group, lines


async def test_group_shows_its_rollouts_side_by_side(
    page: Chromium, server: str, runs: Runs
) -> None:
    group, lines = _a_group(runs)
    await goto(page, server, f"/run/train/group/{quote(group)}", "group")
    columns = await page.evaluate(
        "[...document.querySelectorAll('[data-test=rollout]')].map(e => {"
        " const r = e.getBoundingClientRect();"
        " return [Number(e.dataset.line), r.left, r.right, r.top, r.width, r.height]; })"
    )
    assert sorted(c[0] for c in columns) == sorted(lines), columns
    columns.sort(key=lambda c: c[1])
    for before, after in itertools.pairwise(columns):
        assert after[1] >= before[2] - 1, f"columns overlap: {before} {after}"
        assert abs(after[3] - before[3]) < 2, f"not side by side: {before} {after}"
    assert all(c[4] > 150 and c[5] > 100 for c in columns), columns
    assert columns[-1][2] <= 1280 + 1 or await page.evaluate(
        "[...document.querySelectorAll('[data-test=rollout]')].some(e =>"
        " e.parentElement.scrollWidth > e.parentElement.clientWidth)"
    ), "columns run off the page with no way to scroll to them"
    await screenshot(page, "browser-group.png")


#: A node's heading in a transcript: ``[role]``, or ``[T.N role]`` naming the node.
_HEADING = re.compile(r"\[(?:\d+\.\d+ )?(\w+)\]")


def shown(text: str) -> str:
    """Text as the page shows it: control characters but tab and newlines written as their
    JSON escapes (``\\u001b``)."""
    return "".join(
        f"\\u{ord(c):04x}" if (ord(c) < 0x20 and c not in "\t\n\r") or c == "\x7f" else c
        for c in text
    )


def _transcript_lines(runs: Runs, line: int) -> set[str]:
    """Every line of a rollout's transcript: ``[role]`` (each node's heading, in the form
    ``_heading`` brings it to) and its content's lines."""
    record = read_record(runs.train, line - 1)
    out: set[str] = set()
    for trace in record["traces"]:
        for node in trace["nodes"]:
            message = node.get("message") or {}
            out.add(f"[{message.get('role')}]")
            content = message.get("content")
            if isinstance(content, str):
                out.update(shown(content).split("\n"))
    return out


async def test_diff_of_two_rollouts(page: Chromium, server: str, runs: Runs) -> None:
    _, lines = _a_group(runs)
    a, b = sorted(lines)[:2]
    await goto(page, server, f"/run/train/diff/{a}/{b}", "diff")
    diff = await page.evaluate(
        "[...document.querySelectorAll('[data-test=diff] [data-test=diff-line]')]"
        ".map(e => [e.dataset.op, e.textContent])"
    )
    ops = Counter(op for op, _ in diff)
    assert ops["add"] > 0, ops
    assert ops["del"] > 0, ops
    assert set(ops) <= {"add", "del", "same"}, ops
    old, new = _transcript_lines(runs, a), _transcript_lines(runs, b)

    def known(text: str, lines: set[str]) -> bool:
        # The text itself, or after a one-character marker (+, -, space) and a space.
        for t in (text, text[1:], text[2:], text.rstrip("\n")):
            heading = _HEADING.fullmatch(t)
            if t in lines or (heading is not None and f"[{heading[1]}]" in lines):
                return True
        return False

    wrong = [
        (op, text[:80])
        for op, text in diff
        if (op == "del" and not known(text, old))
        or (op == "add" and not known(text, new))
        or (op == "same" and not (known(text, old) and known(text, new)))
    ]
    assert not wrong, f"diff lines not in their rollout: {wrong[:5]}"
    await screenshot(page, "browser-diff.png")


# -- hostile records --------------------------------------------------------------------------

#: What in the DOM could run or navigate: script elements but the page's own modules, images
#: (but the page's own or data:), inline handlers, javascript:/data: links, frames.
INERT = """(() => {
  const own = (url) => { try { const u = new URL(url, location.href);
    return u.origin === location.origin && u.pathname.startsWith('/static/'); }
    catch { return false; } };
  const attrs = (e) => [...e.attributes].map(a => a.name);
  const urls = [...document.querySelectorAll('[href],[src],[action],[formaction],[xlink\\\\:href]')]
    .flatMap(e => ['href', 'src', 'action', 'formaction', 'xlink:href']
      .map(n => e.getAttribute(n)).filter(v => v !== null));
  return {
    pwned: typeof window.__pwned,
    scripts: [...document.querySelectorAll('script')].filter(s => !own(s.src))
      .map(s => s.outerHTML.slice(0, 120)),
    images: [...document.querySelectorAll('img,image')]
      .filter(i => !(own(i.src) || (i.getAttribute('src') || '').startsWith('data:')))
      .map(i => i.outerHTML.slice(0, 120)),
    handlers: [...document.querySelectorAll('*')].filter(e => attrs(e).some(a => a.startsWith('on')))
      .map(e => e.outerHTML.slice(0, 120)),
    links: urls.filter(u => /^\\s*(javascript|data|vbscript):/i.test(u) && !u.startsWith('data:image/')),
    frames: document.querySelectorAll('iframe,frame,object,embed,base,meta[http-equiv]').length,
  };
})()"""


async def assert_inert(page: Chromium, where: str) -> None:
    found = await page.evaluate(INERT)
    assert found == {
        "pwned": "undefined",
        "scripts": [],
        "images": [],
        "handlers": [],
        "links": [],
        "frames": 0,
    }, f"{where}: {found}"


async def assert_wraps(page: Chromium, where: str) -> None:
    """Nothing runs off the page's right edge (long unbroken strings wrap)."""
    widths = await page.evaluate(
        "[document.documentElement.scrollWidth, document.body.scrollWidth, innerWidth]"
    )
    assert max(widths[:2]) <= widths[2] + 2, (
        f"{where}: the page is {widths[:2]} wide in {widths[2]}"
    )


async def test_hostile_records_stay_inert(page: Chromium, server: str, runs: Runs) -> None:
    body = "document.body.textContent"
    await goto(page, server, "/run/hostile", "list")
    assert await matched(page) == len(runs.hostile_lines)
    text = await page.evaluate(body)
    assert SCRIPT in text
    assert IMG in text
    assert JS_URL in text
    await assert_inert(page, "list")
    await assert_wraps(page, "list")

    await goto(page, server, "/run/hostile/metrics", "metrics")
    names = await page.evaluate(
        "[...document.querySelectorAll('[data-test=plot]')].map(p => p.dataset.metric)"
    )
    assert sorted(names) == sorted(HOSTILE)
    await assert_inert(page, "metrics")

    for line in runs.hostile_lines:
        await goto(page, server, f"/run/hostile/episode/{line}", "episode")
        nodes = await page.evaluate(
            "[...document.querySelectorAll('[data-test=node]')]"
            ".map(e => [Number(e.dataset.trace), Number(e.dataset.node)])"
        )
        assert nodes, f"episode {line} shows no nodes"
        for trace, node in nodes:  # open each, as a user reading it would
            await page.click(node_selector(trace, node))
            await page.wait_for(f"{content_js(trace, node)} !== null", timeout=15)
        await assert_inert(page, f"episode {line}")
        await assert_wraps(page, f"episode {line}")
        text = await page.evaluate(body)
        if line == runs.unbroken_line:
            trace, node = runs.unbroken_node
            content = await page.evaluate(f"{content_js(trace, node)}.textContent")
            assert content.startswith(UNBROKEN[:1000])
            assert len(content) >= 1_000_000
            await page.evaluate(f"{content_js(trace, node)}.scrollIntoView({{block: 'start'}})")
            wide = await page.evaluate(
                f"[{content_js(trace, node)}.scrollWidth, {content_js(trace, node)}.clientWidth]"
            )
            assert wide[0] <= wide[1] + 2, f"the 2 MB string does not wrap: {wide}"
        else:
            assert SCRIPT in text or IMG in text or JS_URL in text, f"episode {line}"
        if line == 4:  # all three in one record: the screenshot of the docs' Security section
            await page.evaluate(f"{node_js(0, 2)}.scrollIntoView({{block: 'start'}})")
            await screenshot(page, "browser-hostile.png")

    await goto(page, server, f"/run/hostile/group/{quote(SCRIPT, safe='')}", "group")
    shown = await page.evaluate(
        "[...document.querySelectorAll('[data-test=rollout]')].map(e => Number(e.dataset.line))"
    )
    assert sorted(shown) == list(runs.hostile_lines)
    await assert_inert(page, "group")
    await assert_wraps(page, "group")

    await goto(page, server, "/run/hostile/diff/1/4", "diff")
    assert await page.evaluate("document.querySelectorAll('[data-test=diff-line]').length") > 0
    await assert_inert(page, "diff")
    await assert_wraps(page, "diff")


async def test_csp_headers_and_inline_script_blocked(
    page: Chromium, server: str, runs: Runs
) -> None:
    await goto(page, server, "/run/hostile/episode/1", "episode")
    responses = [r for r in page.requests.values() if r.url.startswith(server)]
    assert any(r.url == server for r in responses), [r.url for r in responses]
    assert any("/api/" in r.url for r in responses)
    assert any("/static/" in r.url for r in responses)
    for r in responses:
        assert r.headers.get("content-security-policy") == CSP, (r.url, r.headers)
        assert r.headers.get("x-content-type-options") == "nosniff", r.url
        assert r.headers.get("referrer-policy") == "no-referrer", r.url

    page.clear_messages()
    attempt = await page.evaluate(
        """(async () => {
          const seen = [];
          document.addEventListener('securitypolicyviolation', e => seen.push(e.violatedDirective));
          const s = document.createElement('script');
          s.textContent = 'window.__injected = 1';
          document.body.appendChild(s);
          const d = document.createElement('div');
          d.innerHTML = '<img src="data:image/gif;base64,R0lGODlh" onerror="window.__injected = 2">';
          document.body.appendChild(d);
          await new Promise(r => setTimeout(r, 300));
          s.remove(); d.remove();
          return {injected: typeof window.__injected, seen};
        })()"""
    )
    assert attempt["injected"] == "undefined", attempt
    assert any(v.startswith("script-src") for v in attempt["seen"]), attempt
    logged = [
        m
        for m in page.messages
        if m.source in ("security", "violation") and "Content Security" in m.text
    ]
    assert len(logged) >= 2, [m.text[:100] for m in page.messages]
    page.clear_messages()  # the violations this test caused on purpose
