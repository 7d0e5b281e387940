"""An oracle for prime-rl's file-monitor layout, written from prime-rl's reading rules.

nodewise's ``FileMonitor`` lays its run directories out the way prime-rl's does, so that
prime-rl's own tools (its dashboard, its trace readers) read them. The tests need an
independent judge of that: this module reads a run directory by prime-rl's rules and lays a
stream out the way prime-rl writes one, without importing nodewise's trace code (and
without prime-rl, which is not on PyPI). The rules come from these prime-rl files:

- ``src/prime_rl/monitors/file/traces/chunks.py``: chunk numbering, opening a plain or
  sealed chunk, reading a stream, sealing, how ``ChunkedJsonl`` rolls chunks;
- ``src/prime_rl/monitors/file/traces/index.py``: ``summarize_episode``, ``index_row``,
  ``episode_kind``, ``trace_truncated``, ``walk_timing``;
- ``src/prime_rl/monitors/file/traces/update.py``: ``make_update``, ``update_index_row``,
  ``branch_node_paths``, ``fold_trace_updates``;
- ``src/prime_rl/monitors/file/monitor.py``: where the stream, its index, the annotation
  streams and ``metrics.jsonl`` go, and the bytes written to each;
- ``src/prime_rl/dashboard/server.py``: when a run directory is listed (``is_run_dir``),
  when a chunked stream is read (``traces_file``), how index rows are read
  (``index_rows``), how a record is read at its row (``read_episode_at``) and how
  annotations are found and folded (``annotation_streams``, ``annotation_index``,
  ``trace_updates``, ``get_episode``).

It keeps prime-rl's behaviour where that behaviour is unforgiving, on purpose: like
prime-rl, :func:`chunk_numbers` reads a chunk number off every name the glob ``*.jsonl*``
matches in the stream directory, so any stray file there (``index.jsonl``, a lock, a
``.jsonl`` of any other name) raises ``ValueError``. That is the failure the tests prove
nodewise's layout never causes. Everything here is a plain function over files; nothing
is cached.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import orjson
import pyzstd

#: The zstd level prime-rl seals chunks at.
ZSTD_LEVEL = 3
#: The content size of each independent frame of a sealed chunk (``max_frame_content_size``).
FRAME_BYTES = 4 << 20
#: The orjson options prime-rl's file monitor writes every stream line and index row with.
LINE_OPTION = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY
#: The entries whose presence makes the dashboard list a directory as a run.
RUN_MARKERS = ("configs", "logs", "monitors", "traces.jsonl")
#: The stop conditions that count as truncation (``verifiers.v1.Trace.is_truncated``).
TRUNCATING_STOPS = frozenset(
    {"max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "compaction_failed"}
)
#: The version stamped on an update record.
UPDATE_VERSION = 1
#: The per-token streams an update may carry for a branch, projected onto node fields.
STREAM_FIELDS = ("advantages", "trainer_logprobs", "entropies", "is_masked", "mismatch_kl")
#: The streams a node takes even with nulls inside (at least one value must be known).
PARTIAL_STREAM_FIELDS = frozenset({"is_masked", "mismatch_kl"})
#: The index fields ``index_row`` leaves out of ``summarize_episode``'s row.
NESTED_SUMMARY_FIELDS = ("rewards", "metrics", "timing")

Record = dict[str, Any]


# -- where things are -------------------------------------------------------------------


def file_monitor_dir(run_dir: Path) -> Path:
    """``RUN/monitors/file``: the metrics, and the traces with their annotations."""
    return run_dir / "monitors" / "file"


def metrics_path(run_dir: Path) -> Path:
    return file_monitor_dir(run_dir) / "metrics.jsonl"


def traces_dir(run_dir: Path) -> Path:
    return file_monitor_dir(run_dir) / "traces"


def stream_dir(run_dir: Path) -> Path:
    """The directory of the run's episode stream (its chunks)."""
    return traces_dir(run_dir) / "stream"


def annotations_dir(traces: Path) -> Path:
    """Where the producers' annotation streams live, given ``RUN/monitors/file/traces``."""
    return traces / "annotations"


def index_path(stream: Path) -> Path:
    """A chunked stream's index: beside the stream directory, named after it."""
    return stream.parent / f"{stream.name}.index.jsonl"


def chunk_path(directory: Path, number: int) -> Path:
    """The plain file of chunk ``number``; its sealed twin adds ``.zst``."""
    return directory / f"{number:05d}.jsonl"


# -- reading a chunked stream -----------------------------------------------------------


def chunk_numbers(directory: Path) -> dict[int, bool]:
    """Each chunk number in ``directory`` -> whether its plain ``.jsonl`` is present.

    Every name matching ``*.jsonl*`` is taken for a chunk and its number read off the part
    before the first dot; that includes a seal's ``NNNNN.jsonl.zst.tmp`` (which adds the
    number without a plain file of its own), and any other matching name raises
    ``ValueError`` (``int("index")``), as prime-rl's does."""
    found: dict[int, bool] = {}
    for entry in directory.glob("*.jsonl*"):
        number = int(entry.name.split(".", 1)[0])
        is_plain = entry.suffix == ".jsonl"
        found[number] = found.get(number, False) or is_plain
    return found


def open_chunk(directory: Path, number: int) -> IO[bytes]:
    """Chunk ``number`` for reading and seeking: the plain file while there is one, else
    the sealed twin through pyzstd's seekable reader."""
    plain = chunk_path(directory, number)
    try:
        return plain.open("rb")
    except FileNotFoundError:
        sealed = plain.with_name(plain.name + ".zst")
        return pyzstd.SeekableZstdFile(sealed, "rb")  # type: ignore[return-value]


def read_records(directory: Path) -> Iterator[Record]:
    """Every record of the stream, chunk by chunk in number order. The first line that
    does not parse (a torn tail) ends the stream, whatever follows it."""
    for number in sorted(chunk_numbers(directory)):
        with open_chunk(directory, number) as chunk:
            for raw in chunk:
                try:
                    record = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    return
                yield record


def read_index(stream: Path) -> list[Record]:
    """The rows of the stream's index, in order, as the dashboard reads them: reading
    stops at a line without its newline (the writer is mid-append) or one that does not
    parse. No index file gives no rows."""
    path = index_path(stream)
    if not path.is_file():
        return []
    rows: list[Record] = []
    with path.open("rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            try:
                rows.append(orjson.loads(raw))
            except orjson.JSONDecodeError:
                break
    return rows


def read_at(stream: Path, row: Mapping[str, Any]) -> Record:
    """The record an index row points at: its chunk opened, the row's byte offset sought,
    one line read (prime-rl's rows carry no length)."""
    with open_chunk(stream, row.get("chunk", 0)) as chunk:
        chunk.seek(row.get("offset", 0))
        record: Record = orjson.loads(chunk.readline())
        return record


# -- what the dashboard lists -----------------------------------------------------------


def lists_run(run_dir: Path) -> bool:
    """Whether the dashboard lists ``run_dir`` as a run: a directory whose name does not
    start with a dot, holding any of ``configs``, ``logs``, ``monitors`` or
    ``traces.jsonl`` (of any kind: file or directory)."""
    if not run_dir.is_dir() or run_dir.name.startswith("."):
        return False
    return any((run_dir / marker).exists() for marker in RUN_MARKERS)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def lists_stream(stream: Path) -> bool:
    """Whether the dashboard reads ``stream`` as a chunked stream: only the index counts,
    and it must be non-empty. The stream directory itself is not looked at."""
    return _size(index_path(stream)) > 0


def run_stream(run_dir: Path) -> Path | None:
    """The episode stream the dashboard shows for a run: the chunked stream when its index
    is non-empty, else a non-empty bare ``RUN/traces.jsonl``, else none."""
    chunked = stream_dir(run_dir)
    if lists_stream(chunked):
        return chunked
    bare = run_dir / "traces.jsonl"
    if bare.is_file() and bare.stat().st_size > 0:
        return bare
    return None


# -- the episode index ------------------------------------------------------------------


def walk_timing(obj: Mapping[str, Any], prefix: str, out: dict[str, float]) -> None:
    """Adds each timing span under ``obj`` to ``out``, keyed by its slash-joined path.

    A span with a numeric ``duration`` adds that; otherwise numeric ``start`` and ``end``
    add their difference. Then every dict-valued entry is walked, one level deeper. The
    top level's own span (if any) lands under the empty key ``""``."""
    duration = obj.get("duration")
    start, end = obj.get("start"), obj.get("end")
    if isinstance(duration, (int, float)):
        out[prefix] = out.get(prefix, 0.0) + duration
    elif isinstance(start, (int, float)) and isinstance(end, (int, float)):
        out[prefix] = out.get(prefix, 0.0) + (end - start)
    for name, child in obj.items():
        if isinstance(child, dict):
            walk_timing(child, f"{prefix}/{name}" if prefix else name, out)


def episode_kind(rec: Mapping[str, Any]) -> str:
    """``train`` or ``eval`` from the first trace whose info says so; else the run's
    work type, else the run's type, else ``eval``."""
    for trace in rec.get("traces") or []:
        stamped = (trace.get("info") or {}).get("kind")
        if stamped in ("train", "eval"):
            return str(stamped)
    run = rec.get("run") or {}
    kind = (run.get("work") or {}).get("type") or run.get("type") or "eval"
    return str(kind)


def trace_truncated(trace: Mapping[str, Any]) -> bool:
    """A truncating stop condition, or a last error-free model call that stopped on
    ``finish_reason == "length"``."""
    if trace.get("stop_condition") in TRUNCATING_STOPS:
        return True
    for call in reversed(trace.get("calls") or []):
        if call.get("error") is None:
            return bool(call) and call.get("finish_reason") == "length"
    return False


def _mean(values: list[Any]) -> Any:
    return sum(values) / len(values)


def _duration(first_info: Mapping[str, Any], timing: Mapping[str, float]) -> Any:
    dispatched = (first_info.get("dispatch") or {}).get("time")
    arrived = (first_info.get("arrival") or {}).get("time")
    if isinstance(dispatched, (int, float)) and isinstance(arrived, (int, float)):
        return max(0.0, arrived - dispatched)
    top_level = [seconds for phase, seconds in timing.items() if "/" not in phase]
    return sum(top_level) if top_level else None


def _tokens(rec: Mapping[str, Any]) -> tuple[Any, Any]:
    """``num_input_tokens``/``num_output_tokens`` as recorded when both are ints; else
    both recomputed by verifiers from the record."""
    given_in, given_out = rec.get("num_input_tokens"), rec.get("num_output_tokens")
    if isinstance(given_in, int) and isinstance(given_out, int):
        return given_in, given_out
    import verifiers.v1 as vf  # type: ignore[import-untyped]

    episode = vf.WireEpisode.model_validate(rec, extra="ignore")
    return episode.num_input_tokens, episode.num_output_tokens


def summarize_episode(line: int, rec: Mapping[str, Any], offset: int | None = None) -> Record:
    """prime-rl's summary of one episode record, its keys in prime-rl's order.

    ``line`` numbers the episode in its stream from 1. Per trace: its calls' numeric
    ``usage.cost`` values are collected; its branches count its nodes minus the distinct
    ``parent`` values among nodes that have the key; a trace with rewards adds its
    weighted reward sum (score or 0, times weight or 1) to the episode's reward mean;
    reward scores and numeric metrics are averaged per name across traces; timing spans
    are summed per phase path; ``info.advantage`` values are averaged; assistant nodes
    are turns; the last trace holding a ``stop_condition`` key sets it; truncated if any
    trace is. ``dispatch``/``arrival`` come from the first trace's info."""
    input_tokens, output_tokens = _tokens(rec)
    traces = rec.get("traces") or []
    weighted_rewards: list[Any] = []
    advantages: list[Any] = []
    scores: dict[str, list[Any]] = {}
    metric_values: dict[str, list[Any]] = {}
    timing: dict[str, float] = {}
    costs: list[Any] = []
    turns = 0
    branches = 0
    stop_condition: Any = None
    truncated = False
    for trace in traces:
        for call in trace.get("calls") or []:
            usage = call.get("usage") or {}
            if isinstance(usage, dict) and isinstance(usage.get("cost"), (int, float)):
                costs.append(usage["cost"])
        nodes = trace.get("nodes") or []
        distinct_parents = {node.get("parent") for node in nodes if "parent" in node}
        branches += max(0, len(nodes) - len(distinct_parents))
        rewards = trace.get("rewards")
        if rewards:
            total = 0
            for reward in rewards.values():
                if isinstance(reward, dict):
                    weight = reward.get("weight")
                    total += (reward.get("score") or 0) * (1 if weight is None else weight)
            weighted_rewards.append(total)
        for name, reward in (rewards or {}).items():
            if isinstance(reward, dict) and isinstance(reward.get("score"), (int, float)):
                scores.setdefault(name, []).append(reward["score"])
        for name, value in (trace.get("metrics") or {}).items():
            if isinstance(value, (int, float)):
                metric_values.setdefault(name, []).append(value)
        if isinstance(trace.get("timing"), dict):
            walk_timing(trace["timing"], "", timing)
        advantage = (trace.get("info") or {}).get("advantage")
        if advantage is not None:
            advantages.append(advantage)
        turns += sum(1 for node in nodes if (node.get("message") or {}).get("role") == "assistant")
        if "stop_condition" in trace:
            stop_condition = trace["stop_condition"]
        truncated = truncated or trace_truncated(trace)
    first_info = (traces[0] if traces else {}).get("info") or {}
    env = rec.get("env") or {}
    return {
        "rewards": {name: _mean(values) for name, values in scores.items()},
        "metrics": {name: _mean(values) for name, values in metric_values.items()},
        "timing": timing,
        "cost": sum(costs) if costs else None,
        "line": line,
        "offset": offset,
        "id": rec.get("id"),
        "kind": episode_kind(rec),
        "trace_ids": [trace["id"] for trace in traces if trace.get("id")],
        "env": env.get("name") or env.get("id"),
        "group": (rec.get("group") or {}).get("id"),
        "ok": rec.get("ok"),
        "num_errors": len(rec.get("errors") or []),
        "reward": _mean(weighted_rewards) if weighted_rewards else None,
        "advantage": _mean(advantages) if advantages else None,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "turns": turns,
        "branches": branches,
        "stop_condition": stop_condition,
        "truncated": truncated,
        "dispatch": (first_info.get("dispatch") or {}).get("time"),
        "arrival": (first_info.get("arrival") or {}).get("time"),
        "duration": _duration(first_info, timing),
    }


def index_row(line: int, rec: Mapping[str, Any], chunk: int, offset: int) -> Record:
    """The row prime-rl's file monitor writes for an episode: the summary without its
    nested ``rewards``/``metrics``/``timing`` maps, and ``chunk`` added last."""
    row = {
        key: value
        for key, value in summarize_episode(line, rec, offset).items()
        if key not in NESTED_SUMMARY_FIELDS
    }
    row["chunk"] = chunk
    return row


# -- trace updates (annotations) --------------------------------------------------------


def make_update(
    trace_id: str,
    *,
    info: dict[str, Any] | None = None,
    branches: dict[int, dict[str, list[Any]]] | None = None,
) -> Record:
    """One update record for a trace: an ``info`` to merge, and per-branch token streams
    (``branches`` maps a branch index to its streams)."""
    return {
        "version": UPDATE_VERSION,
        "trace_id": trace_id,
        "info": info or {},
        "branches": [{"index": index, **streams} for index, streams in (branches or {}).items()],
    }


def update_index_row(update: Mapping[str, Any], chunk: int, offset: int) -> Record:
    """The index row beside an annotation stream: the update's trace and info, and where
    its record sits."""
    return {
        "trace_id": update.get("trace_id"),
        "chunk": chunk,
        "offset": offset,
        "info": update.get("info") or {},
    }


def branch_node_paths(nodes: list[Record]) -> list[list[int]]:
    """One root-to-leaf list of node indexes per leaf, leaves in index order. A leaf is a
    node no in-range int ``parent`` names; a walk up stops at a missing, out-of-range or
    already visited parent."""
    count = len(nodes)

    def in_range(value: Any) -> bool:
        return isinstance(value, int) and 0 <= value < count

    named = {node.get("parent") for node in nodes if in_range(node.get("parent"))}
    paths: list[list[int]] = []
    for leaf in range(count):
        if leaf in named:
            continue
        upward: list[int] = []
        visited: set[int] = set()
        at: Any = leaf
        while in_range(at) and at not in visited:
            visited.add(at)
            upward.append(at)
            at = nodes[at].get("parent")
        paths.append(upward[::-1])
    return paths


def merge_info(old: Any, new: Any) -> Any:
    """``new`` over ``old``, dicts merged key by key at every depth (old keys keep their
    place, new ones follow); anything else is replaced by ``new``."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return new
    merged = dict(old)
    for key, value in new.items():
        merged[key] = merge_info(old.get(key), value)
    return merged


def _project(nodes: list[Record], path: list[int], field: str, stream: list[Any]) -> None:
    """Lays one branch stream over the branch's nodes, compacted to each node's sampled
    (``mask``) positions. A node the stream does not fully cover ends the projection; a
    node with no sampled value is left; unknown (null) values leave the node too, except
    in a partial stream, which only needs one known value."""
    cursor = 0
    for node_index in path:
        node = nodes[node_index]
        width = len(node.get("token_ids") or [])
        span = stream[cursor : cursor + width]
        cursor += width
        if len(span) < width:
            return
        values = [
            value for value, sampled in zip(span, node.get("mask") or [], strict=False) if sampled
        ]
        if not values:
            continue
        unknown = [value is None for value in values]
        if any(unknown) and (field not in PARTIAL_STREAM_FIELDS or all(unknown)):
            continue
        node[field] = values


def fold_trace_updates(trace: Record, updates: Iterable[Mapping[str, Any]]) -> int:
    """Applies ``updates`` to the dumped ``trace`` in place, in order, so the newest wins:
    each non-empty ``info`` is merged deep into the trace's, each branch's token streams
    are projected onto that branch's nodes. Returns how many nodes then carry
    ``trainer_logprobs``."""
    nodes = trace.get("nodes") or []
    paths = branch_node_paths(nodes)
    for update in updates:
        if update.get("info"):
            trace["info"] = merge_info(trace.get("info") or {}, update["info"])
        for branch in update.get("branches") or []:
            index = branch.get("index")
            if not isinstance(index, int) or not 0 <= index < len(paths):
                continue
            for field in STREAM_FIELDS:
                stream = branch.get(field)
                if stream:
                    _project(nodes, paths[index], field, stream)
    return sum(1 for node in nodes if node.get("trainer_logprobs"))


def annotation_streams(traces: Path) -> list[Path]:
    """The producers' annotation streams: every directory under ``annotations/``, by name."""
    directory = annotations_dir(traces)
    if not directory.is_dir():
        return []
    return sorted(entry for entry in directory.iterdir() if entry.is_dir())


def read_annotations(traces: Path, *, through_index: bool = True) -> dict[str, list[Record]]:
    """Trace id -> its updates, producers in name order, each producer's in write order.

    By default read as the dashboard reads them: through each producer's index
    (``<producer>.index.jsonl``), seeking to every row's record, so an update without an
    index row is not seen and a record that cannot be read or parsed is skipped. With
    ``through_index=False`` every record of every producer's stream is read instead
    (``read_records``), index or not."""
    found: dict[str, list[Record]] = {}
    for stream in annotation_streams(traces):
        if not through_index:
            for update in read_records(stream):
                if update.get("trace_id"):
                    found.setdefault(update["trace_id"], []).append(update)
            continue
        for row in read_index(stream):
            trace_id = row.get("trace_id")
            if not trace_id:
                continue
            try:
                update = read_at(stream, row)
            except (OSError, orjson.JSONDecodeError):
                continue
            found.setdefault(trace_id, []).append(update)
    return found


def fold(record: Mapping[str, Any], annotations: Mapping[str, list[Record]]) -> Record:
    """A copy of an episode record with each trace's updates folded onto it, as prime-rl's
    readers show an arrival record. (The dashboard also stamps a display-only
    ``train_annotations`` summary on traces that gain trainer logprobs; that is left out.)"""
    folded: Record = copy.deepcopy(dict(record))
    for trace in folded.get("traces") or []:
        updates = annotations.get(trace.get("id") or "")
        if updates:
            fold_trace_updates(trace, updates)
    return folded


# -- writing as prime-rl writes ---------------------------------------------------------


def _seal(plain: Path) -> None:
    """Compresses a finished chunk to its seekable-zstd twin through a ``.tmp`` file, then
    removes the plain file."""
    sealed = plain.with_name(plain.name + ".zst")
    partial = sealed.with_name(sealed.name + ".tmp")
    with (
        plain.open("rb") as source,
        pyzstd.SeekableZstdFile(
            partial, "wb", level_or_option=ZSTD_LEVEL, max_frame_content_size=FRAME_BYTES
        ) as target,
    ):
        while piece := source.read(1 << 20):
            target.write(piece)
    partial.replace(sealed)
    plain.unlink()


def _leave_seal_in_progress(plain: Path) -> None:
    """What a seal interrupted half way leaves beside the (still present) plain chunk: the
    frames written so far for the first half of its bytes, and no seek table yet."""
    data = plain.read_bytes()
    half = data[: len(data) // 2]
    frames = b"".join(
        pyzstd.compress(half[at : at + FRAME_BYTES], ZSTD_LEVEL)
        for at in range(0, len(half), FRAME_BYTES)
    )
    plain.with_name(plain.name + ".zst.tmp").write_bytes(frames)


class _ChunkAppender:
    """Appends lines to a chunked stream as prime-rl's ``ChunkedJsonl`` does, sealing
    nothing itself: a relaunch carries on in the last chunk while it is plain, and a line
    goes to a new chunk when the current one holds something and the line would take it
    past ``chunk_bytes``."""

    def __init__(self, directory: Path, chunk_bytes: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.chunk_bytes = chunk_bytes
        existing = chunk_numbers(directory)
        last = max(existing, default=-1)
        self.number = last if existing.get(last) else last + 1
        self.size = max(_size(chunk_path(directory, self.number)), 0)

    def append(self, line: bytes) -> tuple[int, int]:
        if self.size and self.size + len(line) > self.chunk_bytes:
            self.number += 1
            self.size = 0
        offset = self.size
        with chunk_path(self.directory, self.number).open("ab") as f:
            f.write(line)
        self.size += len(line)
        return self.number, offset


def _finish(
    stream: Path, index_lines: list[bytes], seal_upto: int | None, tmp_chunk: int | None
) -> None:
    with index_path(stream).open("ab") as index:
        index.write(b"".join(index_lines))
    for number, plain in sorted(chunk_numbers(stream).items()):
        if plain and seal_upto is not None and number < seal_upto:
            _seal(chunk_path(stream, number))
    if tmp_chunk is not None:
        plain = chunk_path(stream, tmp_chunk)
        if not plain.is_file():
            raise ValueError(f"chunk {tmp_chunk} has no plain file to be mid-seal")
        _leave_seal_in_progress(plain)


def _count_lines(path: Path) -> int:
    """How many lines a file holds (a relaunch numbers its episodes on from there)."""
    if not path.is_file():
        return 0
    with path.open("rb") as f:
        return sum(1 for _ in f)


def write_prime_rl_stream(
    run_dir: Path,
    records: Iterable[Mapping[str, Any]],
    *,
    chunk_bytes: int,
    seal_upto: int | None = None,
    tmp_chunk: int | None = None,
    index_missing_last: int = 0,
) -> Path:
    """Lays ``records`` out as the run's episode stream, as prime-rl's file monitor writes
    one, and returns the stream directory (``RUN/monitors/file/traces/stream``).

    Each record is one ``orjson`` line (``default=str``, newline appended, numpy
    serialized) appended to the numbered chunks, rolling as ``ChunkedJsonl`` does; its
    index row (``index_row``, numbered from 1 after any rows already in the index) goes to
    ``stream.index.jsonl`` beside the directory, the same options, except for the last
    ``index_missing_last`` rows (left out as a crash between the stream's flush and the
    index's leaves them). Chunks numbered below ``seal_upto`` are then sealed (seekable
    zstd, ``FRAME_BYTES`` frames, level ``ZSTD_LEVEL``, the plain file removed); a
    ``seal_upto`` past the last chunk is a finished run's stream. ``tmp_chunk`` leaves a
    ``NNNNN.jsonl.zst.tmp`` beside that chunk's plain file, as a seal in progress does."""
    stream = stream_dir(run_dir)
    appender = _ChunkAppender(stream, chunk_bytes)
    index = index_path(stream)
    line = _count_lines(index)
    index_lines: list[bytes] = []
    for record in records:
        chunk, offset = appender.append(orjson.dumps(record, default=str, option=LINE_OPTION))
        line += 1
        row = index_row(line, record, chunk, offset)
        index_lines.append(orjson.dumps(row, default=str, option=LINE_OPTION))
    if index_missing_last:
        index_lines = index_lines[:-index_missing_last]
    _finish(stream, index_lines, seal_upto, tmp_chunk)
    return stream


def write_prime_rl_annotations(
    run_dir: Path,
    producer: str,
    updates: Iterable[Mapping[str, Any]],
    *,
    chunk_bytes: int = 64 << 20,
    seal_upto: int | None = None,
) -> Path:
    """Appends ``updates`` to ``producer``'s annotation stream as prime-rl's file monitor
    does (``orjson`` lines without ``default``, rows by ``update_index_row`` in
    ``<producer>.index.jsonl`` beside it) and returns the stream directory."""
    stream = annotations_dir(traces_dir(run_dir)) / producer
    appender = _ChunkAppender(stream, chunk_bytes)
    index_lines: list[bytes] = []
    for update in updates:
        chunk, offset = appender.append(orjson.dumps(update, option=LINE_OPTION))
        index_lines.append(
            orjson.dumps(update_index_row(update, chunk, offset), option=LINE_OPTION)
        )
    _finish(stream, index_lines, seal_upto, None)
    return stream


def write_prime_rl_metrics(run_dir: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Appends flat metrics rows (``{"step": N | None, "time": t, **metrics}``) to
    ``RUN/monitors/file/metrics.jsonl`` as prime-rl does, ``json.dumps(row) + "\\n"``
    each, and returns the file."""
    path = metrics_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def read_prime_rl_metrics(run_dir: Path) -> list[Record]:
    """The metrics rows as the dashboard reads them: whole lines only, a line that does
    not parse skipped."""
    path = metrics_path(run_dir)
    if not path.is_file():
        return []
    data = path.read_bytes()
    rows: list[Record] = []
    for raw in data[: data.rfind(b"\n") + 1].splitlines():
        try:
            rows.append(orjson.loads(raw))
        except orjson.JSONDecodeError:
            continue
    return rows
