"""The trace browser's server (``nodewise traces serve``): its API over real run directories,
served by a real aiohttp server on 127.0.0.1, and the checks every request passes.

The page itself is tested in a real Chromium in tests/test_browser_page.py.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from monitors.file import FileMonitor
from monitors.testing.episodes import EpisodeMaker
from monitors.traces import read_records
from monitors.traces._browser import CSP, make_app
from monitors.traces._browser import _episode as episode_module
from monitors.traces._browser._table import IndexTable, Query
from monitors.traces._layout import index_path, stream_of
from tests.prime_rl_rules import write_prime_rl_metrics, write_prime_rl_stream

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("train", "eval")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _records(seed: int, count: int) -> list[dict[str, Any]]:
    maker = EpisodeMaker(seed=seed)
    rng = random.Random(seed)
    out = []
    for i in range(count):
        record = maker.episode(rng.choice([20_000, 60_000, 150_000]), index=i).to_record()
        record["run"]["type"] = record["run"]["work"]["type"] = KINDS[i % 3 == 2]
        if i % 5 == 4:
            record["ok"] = False
            record["errors"] = [{"type": "Timeout", "message": "took too long"}]
        out.append(record)
    return out


async def _write_run(root: Path, records: list[dict[str, Any]], steps: int) -> None:
    per_step = math.ceil(len(records) / steps)
    async with FileMonitor(root, chunk_bytes=256 << 10, fsync=False) as monitor:
        for step in range(steps):
            chosen = records[step * per_step : (step + 1) * per_step]
            for kind in KINDS:
                mine = [r for r in chosen if r["run"]["type"] == kind]
                if mine:
                    await monitor.log_episodes(mine, step=step, kind=kind)
            await monitor.log_metrics(
                {"loss": 1 / (step + 1), "reward/mean": step * 0.5}, step=step
            )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of 30 episodes over 3 steps, train and eval, some with errors, in
    chunks of 256 KiB (so most are sealed), written by FileMonitor."""
    root = tmp_path_factory.mktemp("browser") / "run-a"
    anyio.run(_write_run, root, _records(7, 30), 3)
    return root


@pytest.fixture(scope="module")
def index(run_dir: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in index_path(stream_of(run_dir)).read_bytes().splitlines()]


@pytest.fixture(scope="module")
def stored(run_dir: Path) -> list[Any]:
    return list(read_records(stream_of(run_dir)))


@pytest.fixture
async def client(run_dir: Path) -> AsyncIterator[_Client]:
    async with _serve([run_dir]) as c:
        yield c


class _Client:
    def __init__(self, session: ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def get(self, path: str, **kwargs: Any) -> tuple[int, Any, dict[str, str]]:
        async with self.session.get(self.base + path, allow_redirects=False, **kwargs) as r:
            body = await r.read()
            kind = r.headers.get("Content-Type", "")
            value = orjson.loads(body) if kind.startswith("application/json") else body
            return r.status, value, dict(r.headers)

    async def json(self, path: str) -> Any:
        status, value, _ = await self.get(path)
        assert status == 200, value
        return value


class _serve:
    """A real server on 127.0.0.1 over ``paths`` (``make_app``), and a client of it."""

    def __init__(self, paths: list[Path], **options: Any) -> None:
        self.server = TestServer(make_app(paths, **options), host="127.0.0.1")

    async def __aenter__(self) -> _Client:
        await self.server.start_server()
        self.session = ClientSession()
        return _Client(self.session, str(self.server.make_url("")).rstrip("/"))

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()
        await self.server.close()


def _column(row: dict[str, Any], name: str) -> Any:
    tokens = (row.get("input_tokens") or 0) + (row.get("output_tokens") or 0)
    return {"errors": row.get("num_errors"), "tokens": tokens, "bytes": row.get("length")}.get(
        name, row.get(name)
    )


# -- the list --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_runs_and_every_episode_listed(client: _Client, index: list[dict[str, Any]]) -> None:
    runs = (await client.json("/api/runs"))["runs"]
    assert [(r["name"], r["episodes"], r["steps"], r["metrics"]) for r in runs] == [
        ("run-a", len(index), [0, 1, 2], True)
    ]
    page = await client.json("/api/runs/run-a/episodes?limit=1000")
    assert page["total"] == page["matched"] == len(index) == 30
    assert [r["line"] for r in page["rows"]] == [r["line"] for r in index]
    first = page["rows"][0]
    assert first["id"] == index[0]["id"]
    assert first["reward"] == index[0]["reward"]
    assert first["bytes"] == index[0]["length"]
    assert first["tokens"] == index[0]["input_tokens"] + index[0]["output_tokens"]


@pytest.mark.anyio
@pytest.mark.parametrize("column", ["reward", "-reward", "-tokens", "duration", "-errors", "id"])
async def test_sorted_as_the_index_sorts(
    client: _Client, index: list[dict[str, Any]], column: str
) -> None:
    name = column.lstrip("-")
    page = await client.json(f"/api/runs/run-a/episodes?sort={column}&limit=1000")
    present = [r for r in index if _column(r, name) is not None]
    want = sorted(present, key=lambda r: _column(r, name), reverse=column.startswith("-"))
    got = [r["line"] for r in page["rows"]]
    assert [_column(index[line - 1], name) for line in got[: len(want)]] == [
        _column(r, name) for r in want
    ]
    assert sorted(got) == [r["line"] for r in index]


@pytest.mark.anyio
async def test_filters_count_what_the_index_holds(
    client: _Client, index: list[dict[str, Any]]
) -> None:
    cases = {
        "kind=eval": lambda r: r["kind"] == "eval",
        "kind=train&step=1": lambda r: r["kind"] == "train" and r["step"] == 1,
        "errors=yes": lambda r: r["num_errors"] > 0,
        "errors=no&env=" + index[0]["env"]: lambda r: (
            r["num_errors"] == 0 and r["env"] == index[0]["env"]
        ),
        "group=" + index[3]["group"]: lambda r: r["group"] == index[3]["group"],
        "tokens_min=300&tokens_max=5000": lambda r: (
            300 <= r["input_tokens"] + r["output_tokens"] <= 5000
        ),
    }
    for query, wanted in cases.items():
        page = await client.json(f"/api/runs/run-a/episodes?{query}&limit=1000")
        lines = [r["line"] for r in index if wanted(r)]
        assert page["matched"] == len(lines), query
        assert [r["line"] for r in page["rows"]] == lines, query
    assert (await client.json("/api/runs/run-a/episodes?kind=eval"))["matched"] > 0


@pytest.mark.anyio
async def test_histogram_bins_filter_and_stay_put(
    client: _Client, index: list[dict[str, Any]]
) -> None:
    page = await client.json("/api/runs/run-a/episodes?kind=train")
    edges, counts = page["histogram"]["edges"], page["histogram"]["counts"]
    rewards = [r["reward"] for r in index if r["kind"] == "train" and r["reward"] is not None]
    assert len(edges) == 21
    assert len(counts) == 20
    assert edges[0] == min(r["reward"] for r in index)
    assert edges[-1] == max(r["reward"] for r in index)
    assert sum(counts) == len(rewards)
    last = max(i for i, c in enumerate(counts) if c)
    low, high = edges[last], edges[last + 1]
    picked = await client.json(
        f"/api/runs/run-a/episodes?kind=train&reward_min={low!r}&reward_max={high!r}"
    )
    assert picked["matched"] == counts[last]  # the last bin is closed: the maximum is in it
    assert picked["histogram"] == page["histogram"]  # picking a bin does not move the bins
    assert all(low <= r["reward"] <= high for r in picked["rows"])


@pytest.mark.anyio
async def test_pages_and_bad_queries(client: _Client, index: list[dict[str, Any]]) -> None:
    whole = await client.json("/api/runs/run-a/episodes?sort=-reward&limit=1000")
    pages = []
    for offset in range(0, 30, 7):
        page = await client.json(f"/api/runs/run-a/episodes?sort=-reward&offset={offset}&limit=7")
        assert page["offset"] == offset
        pages += page["rows"]
    assert pages == whole["rows"]
    for query, word in [
        ("sort=colour", "sort"),
        ("errors=maybe", "errors"),
        ("step=one", "step"),
        ("reward_min=nan", "reward_min"),
        ("limit=5000", "limit"),
        ("offset=-1", "offset"),
    ]:
        status, body, _ = await client.get(f"/api/runs/run-a/episodes?{query}")
        assert status == 400, query
        assert body["error"]["code"] == "bad_query"
        assert word in body["error"]["message"]
    status, body, _ = await client.get("/api/runs/nope/episodes")
    assert status == 404
    assert body["error"]["code"] == "not_found"


@pytest.mark.anyio
async def test_a_sort_of_many_rows_gives_the_loop_back() -> None:
    """100,000 rows are sorted and filtered in steps: other tasks run meanwhile, and the
    order is Python's own sort of the same values (ties in line order, missing last)."""
    rng = random.Random(5)
    rows = []
    for line in range(1, 100_001):
        reward = None if line % 17 == 0 else round(rng.random(), 2)
        rows.append(
            orjson.dumps(
                {
                    "line": line,
                    "chunk": 0,
                    "offset": line,
                    "reward": reward,
                    "kind": KINDS[line % 2],
                }
            )
        )
    table = IndexTable()
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await anyio.sleep(0)

    async with anyio.create_task_group() as group:
        group.start_soon(ticker)
        await table.take(rows)
        before = ticks
        page = await table.page(
            Query.parse({"sort": "-reward", "kind": "eval"}), offset=0, limit=1000
        )
        during = ticks - before
        done = True
    assert during >= 10  # the sort and the filter gave the loop back, again and again
    async with anyio.create_task_group() as group:
        done = False
        group.start_soon(ticker)
        before = ticks
        tail = await table.page(Query.parse({"sort": "-reward"}), offset=99_990, limit=10)
        filtering = ticks - before  # the order is kept: this is the filter's pass alone
        done = True
    assert filtering >= 3
    # rows without a reward come last, in line order
    assert [r["line"] for r in tail.rows] == [n for n in range(1, 100_001) if n % 17 == 0][-10:]
    want = sorted(
        (line for line in range(1, 100_001) if line % 2 == 1 and line % 17),
        key=lambda line: -orjson.loads(rows[line - 1])["reward"],
    )
    assert [r["line"] for r in page.rows] == want[:1000]
    assert page.matched == len([line for line in range(1, 100_001) if line % 2 == 1])


# -- metrics ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_metrics_by_step(client: _Client) -> None:
    metrics = await client.json("/api/runs/run-a/metrics")
    assert metrics["step"] == [0, 1, 2]
    assert metrics["metrics"] == {"loss": [1.0, 0.5, 1 / 3], "reward/mean": [0.0, 0.5, 1.0]}


# -- one episode -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_outline_names_every_node(client: _Client, stored: list[Any]) -> None:
    for line in (1, 17, 30):
        record = stored[line - 1]
        outline = await client.json(f"/api/runs/run-a/episodes/{line}")
        assert outline["row"]["line"] == line
        assert outline["bytes"] == len(orjson.dumps(record))
        assert outline["fields"]["id"] == record["id"]
        assert outline["fields"]["env"] == record["env"]
        assert len(outline["traces"]) == len(record["traces"])
        for t, trace in enumerate(record["traces"]):
            got = outline["traces"][t]
            assert got["id"] == trace["id"]
            assert got["agent"] == trace["agent"]["name"]
            assert len(got["nodes"]) == len(trace["nodes"])
            for n, node in enumerate(trace["nodes"]):
                line_of = got["nodes"][n]
                message = node["message"]
                assert line_of["role"] == message["role"]
                assert line_of["preview"] == (message.get("content") or "")[:200]
                assert line_of["chars"] == len(message.get("content") or "")
                assert line_of["tokens"] == len(node["token_ids"])
                assert line_of["tool_calls"] == len(message.get("tool_calls") or [])
                assert line_of["bytes"] == len(orjson.dumps(node))
                parent = node.get("parent")
                parents = node.get("semantic_parents") or ([parent] if parent is not None else [])
                assert line_of["parents"] == parents
        again = await client.json(f"/api/runs/run-a/episodes/{line}")
        assert again["ms"] == 0
        assert again["traces"] == outline["traces"]


@pytest.mark.anyio
async def test_a_node_is_read_alone(
    client: _Client, stored: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node comes back equal to the stored record's, read as its own bytes: no read of
    the record beyond its outline's."""
    reads: list[tuple[int, int | None]] = []
    real, real_line = episode_module._read, episode_module._read_line

    def spy(run: Any, where: Any, start: int, end: int) -> bytes:
        reads.append((start, end))
        return real(run, where, start, end)

    def spy_line(run: Any, where: Any) -> Any:
        reads.append((0, None))
        return real_line(run, where)

    monkeypatch.setattr(episode_module, "_read", spy)
    monkeypatch.setattr(episode_module, "_read_line", spy_line)
    line = max(range(1, 31), key=lambda n: len(orjson.dumps(stored[n - 1])))
    record = stored[line - 1]
    await client.json(f"/api/runs/run-a/episodes/{line}")
    assert reads == [(0, None)]  # the outline read the line once
    for t, trace in enumerate(record["traces"]):
        for n in (0, len(trace["nodes"]) - 1):
            node = trace["nodes"][n]
            got = await client.json(f"/api/runs/run-a/episodes/{line}/traces/{t}/nodes/{n}")
            assert got["message"] == node["message"]
            assert got["truncated"] is False
            for key in ("token_ids", "logprobs", "mask", "is_content"):
                assert got["tokens"][key] == node.get(key)
            assert got["tokens"]["count"] == len(node["token_ids"])
            others = {
                k: v
                for k, v in node.items()
                if k not in ("message", "token_ids", "logprobs", "mask", "is_content", "advantages")
            }
            assert got["fields"] == others
    assert reads[0] == (0, None)
    assert all(end is not None and end - start < 10**6 for start, end in reads[1:])
    status, body, _ = await client.get(f"/api/runs/run-a/episodes/{line}/traces/99/nodes/0")
    assert status == 404
    assert "trace 99" in body["error"]["message"]
    status, body, _ = await client.get("/api/runs/run-a/episodes/31")
    assert status == 404
    assert "line 31" in body["error"]["message"]


@pytest.mark.anyio
async def test_text_for_a_diff(client: _Client, stored: list[Any]) -> None:
    text = await client.json("/api/runs/run-a/episodes/2/text")
    record = stored[1]
    want = "".join(
        f"[{t}.{n} {node['message']['role']}]\n{node['message'].get('content') or ''}\n"
        for t, trace in enumerate(record["traces"])
        for n, node in enumerate(trace["nodes"])
    )
    assert text == {"text": want, "truncated": False}


@pytest.mark.anyio
async def test_a_long_text_is_cut_at_2_mib(tmp_path: Path) -> None:
    run = tmp_path / "long"
    record = EpisodeMaker(seed=12).episode(20_000, index=0).to_record()
    nodes = record["traces"][0]["nodes"]
    for i, node in enumerate(nodes):
        node["message"] = {"role": "user", "content": f"{i}:" + "w" * (40_000 + i)}
    nodes *= 60 // len(nodes) + 1  # past 2 MiB of text, each message under 64 KiB
    write_prime_rl_stream(run, [record], chunk_bytes=64 << 20)
    async with _serve([run]) as c:
        text = await c.json("/api/runs/long/episodes/1/text")
    whole = "".join(f"[0.{n} user]\n{node['message']['content']}\n" for n, node in enumerate(nodes))
    assert text["truncated"] is True
    assert len(text["text"]) <= 2 << 20 < len(whole)
    assert whole.startswith(text["text"])
    assert len(text["text"]) > (2 << 20) - 50_000


def _huge_record(content_bytes: int) -> dict[str, Any]:
    record = EpisodeMaker(seed=11).episode(20_000, index=0).to_record()
    node = record["traces"][0]["nodes"][1]
    node["message"] = {"role": "user", "content": 'é\\"' + "a" * content_bytes + "<tail>"}
    return record


@pytest.mark.anyio
async def test_huge_content_is_cut(tmp_path: Path) -> None:
    """A 3 MB message is served cut to 1 MiB, the cut marked; its preview is its start."""
    run = tmp_path / "huge"
    record = _huge_record(3 << 20)
    write_prime_rl_stream(run, [record], chunk_bytes=64 << 20)
    async with _serve([run]) as c:
        outline = await c.json("/api/runs/huge/episodes/1")
        content = record["traces"][0]["nodes"][1]["message"]["content"]
        node_line = outline["traces"][0]["nodes"][1]
        assert node_line["preview"] == content[:200]
        assert node_line["chars"] is None
        node = await c.json("/api/runs/huge/episodes/1/traces/0/nodes/1")
        assert node["truncated"] is True
        got = node["message"]["content"]
        assert (1 << 20) - 16 <= len(got.encode()) <= 1 << 20
        assert content.startswith(got)
        assert node["message"]["role"] == "user"


# -- prime-rl's runs, live runs --------------------------------------------------------------


@pytest.mark.anyio
async def test_a_prime_rl_run_sealed(tmp_path: Path) -> None:
    """prime-rl's layout: rows without ``length``, chunks sealed; metrics written by its
    rules (``None`` steps, strings among numbers)."""
    run = tmp_path / "prime"
    records = _records(3, 12)
    write_prime_rl_stream(run, records, chunk_bytes=200 << 10, seal_upto=10**6)
    write_prime_rl_metrics(
        run,
        [
            {"step": 0, "time": 1.0, "loss": 2.0, "note": "x"},
            {"step": None, "time": 2.0, "acc": 0.5},
        ],
    )
    assert not list((run / "monitors/file/traces/stream").glob("*.jsonl"))
    async with _serve([run]) as c:
        page = await c.json("/api/runs/prime/episodes?sort=-reward&limit=100")
        assert page["total"] == 12
        assert all(r["bytes"] is None for r in page["rows"])
        outline = await c.json("/api/runs/prime/episodes/12")
        assert outline["fields"]["id"] == records[11]["id"]
        node = await c.json("/api/runs/prime/episodes/12/traces/0/nodes/0")
        assert node["message"] == records[11]["traces"][0]["nodes"][0]["message"]
        metrics = await c.json("/api/runs/prime/metrics")
        assert metrics == {"step": [0, None], "metrics": {"loss": [2.0, None], "acc": [None, 0.5]}}


@pytest.mark.anyio
async def test_new_episodes_appear_while_the_run_writes(tmp_path: Path) -> None:
    run = tmp_path / "live"
    records = _records(5, 6)
    async with FileMonitor(run, fsync=False) as monitor:
        await monitor.log_episodes(records[:2], step=0)
        async with _serve([run]) as c:
            assert (await c.json("/api/runs/live/status"))["episodes"] == 2
            await monitor.log_episodes(records[2:], step=1)
            with anyio.fail_after(10):
                while (await c.json("/api/runs/live/status"))["episodes"] < 6:
                    await anyio.sleep(0.1)
            page = await c.json("/api/runs/live/episodes?step=1")
            assert page["matched"] == 4
            assert page["facets"]["steps"] == [0, 1]


@pytest.mark.anyio
async def test_runs_with_one_name(tmp_path: Path, run_dir: Path) -> None:
    other = tmp_path / "run-a"
    write_prime_rl_stream(other, _records(9, 2), chunk_bytes=1 << 20)
    async with _serve([run_dir, other]) as c:
        runs = (await c.json("/api/runs"))["runs"]
        assert [(r["name"], r["episodes"]) for r in runs] == [("run-a", 30), ("run-a-2", 2)]


# -- security --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_every_answer_carries_the_policy(client: _Client) -> None:
    for path in [
        "/",
        "/static/app.js",
        "/api/runs",
        "/api/runs/x/episodes",
        "/nothing",
        "/static/nope.js",
    ]:
        status, _, headers = await client.get(path)
        assert headers["Content-Security-Policy"] == CSP, path
        assert "script-src 'self'" in CSP
        assert "unsafe-inline" not in CSP
        assert headers["X-Content-Type-Options"] == "nosniff"
    status, body, headers = await client.get("/")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert b"<script>" not in body
    assert b'type="module"' in body


@pytest.mark.anyio
async def test_no_file_outside_the_runs(client: _Client, run_dir: Path, tmp_path: Path) -> None:
    secret = b"nodewise-secret-" + os.urandom(8).hex().encode()
    (run_dir.parent / "secret.txt").write_bytes(secret)
    probes = [
        "/static/../secret.txt",
        "/static/%2e%2e/secret.txt",
        "/static/..%2fsecret.txt",
        "/static/%2e%2e%2f%2e%2e%2fsecret.txt",
        "/static/" + str(run_dir.parent / "secret.txt"),
        "/static/%2Fetc%2Fpasswd",
        "/api/runs/..%2f..%2f/episodes",
        "/api/runs/%2e%2e/metrics",
        "/api/runs/run-a/episodes/1/../../../../secret.txt",
        "/../../../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
    ]
    for probe in probes:
        status, body, _ = await client.get(probe)
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        assert secret not in raw, probe
        assert b"root:" not in raw, probe
        assert status in (400, 404), (probe, status)


@pytest.mark.anyio
async def test_symlinks_out_of_a_run_are_refused(tmp_path: Path) -> None:
    run = tmp_path / "linked"
    write_prime_rl_stream(run, _records(4, 2), chunk_bytes=1 << 20)
    stream = run / "monitors/file/traces/stream"
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "00000.jsonl"
    (stream / "00000.jsonl").rename(target)
    (stream / "00000.jsonl").symlink_to(target)
    metrics = outside / "metrics.jsonl"
    metrics.write_text('{"step": 0, "leak": 1.0}\n')
    (run / "monitors/file/metrics.jsonl").symlink_to(metrics)
    async with _serve([run]) as c:
        status, body, _ = await c.get("/api/runs/linked/episodes/1")
        assert status == 422
        assert "outside the run" in body["error"]["message"]
        assert (await c.json("/api/runs/linked/metrics"))["metrics"] == {}


@pytest.mark.anyio
async def test_loopback_answers_only_loopback_names(client: _Client) -> None:
    for host in ["localhost", "127.0.0.1", "localhost:7788", "[::1]:80"]:
        status, _, _ = await client.get("/api/runs", headers={"Host": host})
        assert status == 200, host
    for host in ["evil.example", "evil.example:80", "127.0.0.1.evil.example", "[::2]"]:
        status, body, headers = await client.get("/api/runs", headers={"Host": host})
        assert status == 403, host
        assert body["error"]["code"] == "bad_host", host
        assert headers["Content-Security-Policy"] == CSP


@pytest.mark.anyio
async def test_any_other_host_needs_the_token(run_dir: Path) -> None:
    with pytest.raises(ValueError, match="needs a token"):
        make_app([run_dir], host="0.0.0.0")
    token = "t0k3n-" + os.urandom(6).hex()
    async with _serve([run_dir], host="0.0.0.0", token=token) as c:
        for path in ["/", "/static/app.js", "/api/runs", "/api/runs/run-a/episodes/1"]:
            status, body, _ = await c.get(path)
            assert status == 401, path
            assert body["error"]["code"] == "no_token", path
        status, _, _ = await c.get("/api/runs", headers={"Authorization": "Bearer wrong"})
        assert status == 401
        status, _, _ = await c.get("/api/runs?token=wrong")
        assert status == 401
        status, _, headers = await c.get(f"/?token={token}&x=1")
        assert status == 302
        assert headers["Location"] == "/?x=1"
        assert "HttpOnly" in headers["Set-Cookie"]
        assert "SameSite=Strict" in headers["Set-Cookie"]
        status, _, _ = await c.get("/api/runs", headers={"Authorization": f"Bearer {token}"})
        assert status == 200
        status, _, _ = await c.get("/api/runs", cookies={"nodewise_token": token})
        assert status == 200


# -- the command -----------------------------------------------------------------------------


@contextmanager
def _serve_process(*args: str | Path) -> Iterator[subprocess.Popen[str]]:
    with subprocess.Popen(
        [sys.executable, "-m", "monitors.traces", "serve", *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()


def test_the_command_serves_until_told_to_stop(run_dir: Path) -> None:
    with _serve_process(run_dir, "--port", "0") as process:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith("serving http://127.0.0.1:")
        assert first.endswith("/\n")

        async def ask() -> Any:
            async with ClientSession() as s, s.get(first.split()[1] + "api/runs") as r:
                return await r.json()

        assert anyio.run(ask)["runs"][0]["episodes"] == 30
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0


def test_the_command_prints_a_token_beyond_the_loopback(run_dir: Path) -> None:
    with _serve_process(run_dir, "--port", "0", "--host", "0.0.0.0") as process:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith("serving http://0.0.0.0:")
        assert "/?token=" in first
        assert len(first.split("token=")[1].strip()) >= 32
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) in (0, 130)


def test_the_command_names_a_directory_that_is_no_run(tmp_path: Path) -> None:
    with _serve_process(tmp_path / "missing") as process:
        assert process.wait(timeout=60) == 1
        assert process.stderr is not None
        assert "does not exist" in process.stderr.read()


def test_the_page_is_served_whole() -> None:
    """Every file of the page is served (a wheel carries them all: tests/test_readme.py)."""
    from monitors.traces._browser._app import _web_files

    names = sorted(p.name for p in (ROOT / "monitors/traces/_browser/web").iterdir())
    assert {"index.html", "app.js", "style.css"} <= set(names)
    assert sorted(_web_files()) == names


@pytest.mark.anyio
async def test_a_run_served_before_its_first_episode(tmp_path: Path) -> None:
    """A run whose monitor has logged metrics only: served empty, its episodes appear."""
    run = tmp_path / "early"
    async with FileMonitor(run, fsync=False) as monitor:
        await monitor.log_metrics({"loss": 1.0}, step=0)
        async with _serve([run]) as c:
            assert (await c.json("/api/runs/early/status")) == {"episodes": 0, "metrics": 1}
            await monitor.log_episodes(_records(2, 2), step=0)
            with anyio.fail_after(10):
                while (await c.json("/api/runs/early/status"))["episodes"] < 2:
                    await anyio.sleep(0.1)


@pytest.mark.anyio
async def test_damaged_records_are_named_and_the_rest_served(tmp_path: Path) -> None:
    run = tmp_path / "damaged"
    records = _records(6, 3)
    stream = write_prime_rl_stream(run, records, chunk_bytes=64 << 20)
    chunk = stream / "00000.jsonl"
    data = bytearray(chunk.read_bytes())
    ids = orjson.dumps(records[0]["traces"][0]["nodes"][0]["token_ids"])
    at = data.index(ids) + 1
    data[at : at + 1] = b"x"  # a token id that is no number: the outline skips over it
    chunk.write_bytes(bytes(data))
    index = index_path(stream)
    rows = index.read_bytes().splitlines()
    far = orjson.loads(rows[2])
    far["offset"] = len(data) + 10  # a row pointing past the data
    index.write_bytes(b"\n".join([*rows[:2], orjson.dumps(far)]) + b"\n")
    async with _serve([run]) as c:
        assert len((await c.json("/api/runs/damaged/episodes/1"))["traces"]) > 0
        status, body, _ = await c.get("/api/runs/damaged/episodes/1/traces/0/nodes/0")
        assert status == 422
        assert body["error"]["code"] == "bad_record"
        assert "episode at line 1, trace 0 node 0" in body["error"]["message"]
        assert "00000.jsonl" in body["error"]["message"]
        status, body, _ = await c.get("/api/runs/damaged/episodes/3")
        assert status == 422
        assert "episode at line 3" in body["error"]["message"]
        node = await c.json("/api/runs/damaged/episodes/2/traces/0/nodes/0")
        assert node["message"] == records[1]["traces"][0]["nodes"][0]["message"]
        node = await c.json("/api/runs/damaged/episodes/1/traces/0/nodes/1")
        assert node["message"] == records[0]["traces"][0]["nodes"][1]["message"]


@pytest.mark.anyio
async def test_a_record_is_unmapped_off_the_loop(
    client: _Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record read for an outline is held in a mapping, unmapped in a worker thread once
    outlined (unmapping 60 MB takes 5-15 ms, with the GIL released)."""
    closed: list[tuple[int, bool]] = []
    real = episode_module._close

    def spy(line: Any) -> None:
        real(line)
        closed.append((threading.get_ident(), line.closed))

    monkeypatch.setattr(episode_module, "_close", spy)
    await client.json("/api/runs/run-a/episodes/6")
    ((thread, done),) = closed
    assert done
    assert thread != threading.get_ident()  # not the loop's thread


@pytest.mark.anyio
async def test_a_stream_directory_given(run_dir: Path, tmp_path: Path) -> None:
    """A stream's directory is served with its index beside it and, in a run's layout, the
    run's metrics; a symlink out of the directory holding it is still refused."""
    stream = stream_of(run_dir)
    async with _serve([stream]) as c:
        (run,) = (await c.json("/api/runs"))["runs"]
        assert (run["name"], run["episodes"], run["metrics"]) == ("stream", 30, True)
        assert (await c.json("/api/runs/stream/episodes/30"))["row"]["line"] == 30
    loose = tmp_path / "loose"
    write_prime_rl_stream(loose, _records(8, 2), chunk_bytes=1 << 20)
    moved = tmp_path / "elsewhere"
    (loose / "monitors/file/traces").rename(moved)
    outside = tmp_path / "outside.jsonl"
    (moved / "stream" / "00000.jsonl").rename(outside)
    (moved / "stream" / "00000.jsonl").symlink_to(outside)
    async with _serve([moved / "stream"]) as c:
        assert (await c.json("/api/runs"))["runs"][0]["episodes"] == 2
        status, body, _ = await c.get("/api/runs/stream/episodes/1")
        assert status == 422
        assert "outside the run" in body["error"]["message"]
