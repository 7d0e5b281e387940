"""Run directories that prime-rl's own tools read, and prime-rl's that nodewise reads.

``prime_rl_rules`` is a reader written from prime-rl's reading rules (its glob and chunk
numbers, plain-else-sealed chunks, the index beside the stream, readline at an offset, the
dashboard's conditions for listing a run, ``summarize_episode``): every run FileMonitor
writes must read through it, field for field. The other way round, nodewise reads a
stream laid out exactly as prime-rl writes one.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import anyio
import orjson
import prime_rl_rules as rules
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_verifiers_records import episodes as verifiers_episodes
from test_wandb_monitor import download, traces_saved
from verifiers.v1.episode import WireEpisode

import encoder
from monitors import DeliveryStats, FileMonitor, Monitors, WandbMonitor
from monitors.errors import TraceWriteError
from monitors.records import Records
from monitors.testing import EpisodeMaker
from monitors.traces import find_record, read_record, read_records
from monitors.traces._annotations import fold
from monitors.traces._layout import index_path
from monitors.traces._summary import TopFields, episode_row

#: The row keys nodewise adds to prime-rl's.
OURS = ("length", "step")


def as_record(episode: Any) -> dict[str, Any]:
    """What the stream holds for ``episode``, parsed."""
    record = episode if isinstance(episode, dict) else episode.to_record()
    return orjson.loads(orjson.dumps(record))  # type: ignore[no-any-return]


def maker_records(n: int, *, seed: int = 3) -> list[dict[str, Any]]:
    maker = EpisodeMaker(seed=seed)
    return [maker.episode(30_000 + 7_000 * i, index=i).to_record(fresh=True) for i in range(n)]


async def write_run(
    root: Path, batches: list[tuple[list[Any], str, str]], **options: Any
) -> FileMonitor:
    async with FileMonitor(root, chunk_bytes=100_000, **options) as monitor:
        for step, (batch, kind, subset) in enumerate(batches):
            await monitor.log_episodes(batch, step=step, kind=kind, subset=subset)  # type: ignore[arg-type]
            await monitor.log_metrics({"loss": 1 / (step + 1)}, step=step)
    return monitor


def check_with_prime_rl(root: Path, logged: list[tuple[Any, str, int]]) -> None:
    """prime-rl's rules list the run and its stream and read every record, each index row
    pointing at its record and saying what ``index_row`` says of it."""
    assert rules.lists_run(root)
    stream = rules.stream_dir(root)
    assert rules.run_stream(root) == stream
    want = [as_record(episode) for episode, _, _ in logged]
    assert list(rules.read_records(stream)) == want
    rows = rules.read_index(stream)
    assert len(rows) == len(want)
    for line, (row, record, (_, kind, step)) in enumerate(zip(rows, want, logged, strict=True), 1):
        assert rules.read_at(stream, row) == record
        # prime-rl sums up the record it holds, before it is written (a non-finite float
        # is null on disk), and writes the row with orjson: so do we, and compare rows.
        raw = logged[line - 1][0]
        raw = raw if isinstance(raw, dict) else raw.to_record()
        theirs = orjson.loads(
            orjson.dumps(rules.index_row(line, raw, row["chunk"], row["offset"]), default=str)
        )
        ours = {key: value for key, value in row.items() if key not in OURS}
        assert ours == {**theirs, "kind": kind}  # the kind the episode was logged as
        assert list(ours) == list(theirs)  # and in prime-rl's order
        assert row["step"] == step
        assert row["length"] == len(orjson.dumps(record)) + 1


@pytest.mark.parametrize("seal_on_finalize", [True, False])
def test_prime_rl_reads_a_run_of_maker_records(tmp_path: Path, seal_on_finalize: bool) -> None:
    records = maker_records(9)
    batches = [
        (records[:4], "train", "all"),
        (records[4:6], "eval", "all"),
        (records[6:], "train", "all"),
    ]
    anyio.run(lambda: write_run(tmp_path, batches, seal_on_finalize=seal_on_finalize))
    logged = [(r, kind, step) for step, (batch, kind, _) in enumerate(batches) for r in batch]
    check_with_prime_rl(tmp_path, logged)
    names = sorted(p.name for p in rules.stream_dir(tmp_path).iterdir())
    assert len(names) > 3
    assert all(name.split(".", 1)[0].isdigit() for name in names)
    assert rules.chunk_numbers(rules.stream_dir(tmp_path))  # prime-rl's glob raises on nothing
    assert [row["step"] for row in rules.read_prime_rl_metrics(tmp_path)] == [0, 1, 2]
    assert list(rules.read_prime_rl_metrics(tmp_path)[0]) == ["step", "time", "loss"]


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(verifiers_episodes(), min_size=1, max_size=4), data=st.data())
def test_prime_rl_reads_a_run_of_verifiers_episodes(
    tmp_path_factory: pytest.TempPathFactory, batch: list[Any], data: st.DataObject
) -> None:
    """verifiers' objects, walked by the encoder and summed up from their skeleton: the
    rows say what prime-rl's ``summarize_episode`` says of the records they wrote."""
    for episode in batch:
        for trace in episode.traces:
            if data.draw(st.booleans()):
                trace.info["advantage"] = data.draw(st.floats(-2, 2))
            if data.draw(st.booleans()):
                trace.info["dispatch"] = {"time": 100.0}
                trace.info["arrival"] = {"time": data.draw(st.floats(50, 200))}
    kind = data.draw(st.sampled_from(["train", "eval"]))
    root = tmp_path_factory.mktemp("run")
    anyio.run(lambda: write_run(root, [(batch, kind, "all")], float_decimals=None))
    check_with_prime_rl(root, [(e.to_record(float_decimals=None), kind, 0) for e in batch])


def test_token_counts_match_prime_rl_on_verifiers_loaded_records(tmp_path: Path) -> None:
    """EpisodeMaker's records loaded into verifiers' models, as a consumer does."""
    episodes = [WireEpisode.model_validate(r) for r in maker_records(3, seed=8)]
    anyio.run(lambda: write_run(tmp_path, [(episodes, "train", "all")]))
    check_with_prime_rl(tmp_path, [(e.to_record(), "train", 0) for e in episodes])


def test_the_effective_cohort_is_annotations_not_a_second_copy(tmp_path: Path) -> None:
    records = maker_records(4)
    fresh = maker_records(1, seed=99)  # shipped without being logged first: written once
    batches = [(records, "train", "all"), (records[1:3] + fresh, "train", "effective")]
    monitor = anyio.run(lambda: write_run(tmp_path, batches, producer="orchestrator"))
    assert monitor.stats().delivered == 7
    stream = rules.stream_dir(tmp_path)
    assert [r["id"] for r in rules.read_records(stream)] == [r["id"] for r in records + fresh]
    shipped = {t["id"] for r in records[1:3] + fresh for t in r["traces"]}
    updates = rules.read_annotations(rules.traces_dir(tmp_path))  # through the index
    assert set(updates) == shipped
    assert all(
        u == [rules.make_update(t, info={"shipped": {"step": 1, "kind": "train"}})]
        for t, u in updates.items()
    )
    # Folded as prime-rl folds them, and left apart unless asked.
    want = [rules.fold(as_record(r), updates) for r in records + fresh]
    assert list(read_records(tmp_path, fold=True)) == want
    assert list(read_records(tmp_path)) == [as_record(r) for r in records + fresh]
    assert all(row["producer"] == "orchestrator" for row in rules.read_prime_rl_metrics(tmp_path))


@pytest.mark.anyio
async def test_log_annotations_appends_a_callers_updates(tmp_path: Path) -> None:
    records = maker_records(2)
    trace = records[0]["traces"][0]
    updates = [
        rules.make_update(trace["id"], info={"advantage": 0.5, "deep": {"a": 1}}),
        rules.make_update(trace["id"], info={"deep": {"b": 2}}),
        # Per-token streams over branch 0, longer than it (covering it whole).
        rules.make_update(
            trace["id"],
            branches={0: {"advantages": [0.25] * 50_000, "mismatch_kl": [None, 0.5] * 25_000}},
        ),
    ]
    async with FileMonitor(tmp_path, producer="trainer") as monitor:
        await monitor.log_episodes(records, step=0, subset="all")
        await monitor.log_annotations(updates, step=0)
        with pytest.raises(TypeError, match="trace_id"):
            await monitor.log_annotations([{"info": {}}])
    found = rules.read_annotations(rules.traces_dir(tmp_path))
    assert found == {trace["id"]: updates}
    (folded, _) = read_records(tmp_path, fold=True)
    assert folded["traces"][0]["info"] == {
        **trace.get("info", {}),
        "advantage": 0.5,
        "deep": {"a": 1, "b": 2},
    }
    assert folded == rules.fold(records[0], found)
    sampled = [n for n in folded["traces"][0]["nodes"] if any(n.get("mask") or [])]
    assert sampled
    assert all("advantages" in n and "mismatch_kl" in n for n in sampled)


def test_nodewise_reads_and_extends_a_stream_prime_rl_wrote(tmp_path: Path) -> None:
    """Variable-width rows without a length, sealed chunks, a ``.zst.tmp`` mid-seal and an
    index missing its last rows: read as they are, and appended to."""
    records = maker_records(10)
    stream = rules.write_prime_rl_stream(
        tmp_path, records, chunk_bytes=80_000, seal_upto=3, tmp_chunk=3, index_missing_last=2
    )
    assert any(p.name.endswith(".zst.tmp") for p in stream.iterdir())
    assert list(read_records(tmp_path)) == records
    for n in range(8):  # through the index: the line at each row's offset
        assert read_record(tmp_path, n) == records[n]
        assert find_record(tmp_path, records[n]["id"]) == records[n]
    with pytest.raises(IndexError):
        read_record(tmp_path, 8)  # not indexed yet
    more = maker_records(2, seed=11)
    anyio.run(lambda: write_run(tmp_path, [(more, "eval", "all")]))
    # The crash's leftovers mended, the missing rows rebuilt, numbering carried on.
    assert not any(p.name.endswith(".tmp") for p in stream.iterdir())
    check = copy.deepcopy(records + more)
    assert list(rules.read_records(stream)) == check
    rows = rules.read_index(stream)
    assert [row["line"] for row in rows] == list(range(1, 13))
    for n, row in enumerate(rows):
        assert rules.read_at(stream, row) == check[n]
        assert read_record(tmp_path, n) == check[n]
    assert index_path(stream) == rules.index_path(stream)


@pytest.mark.anyio
async def test_monitors_pass_annotations_to_each_monitor(tmp_path: Path) -> None:
    update = rules.make_update("t-1", info={"judge": 0.5})
    async with Monitors(FileMonitor(tmp_path / "a"), FileMonitor(tmp_path / "b")) as both:
        await both.log_annotations([update], step=3)
    for run in ("a", "b"):
        assert rules.read_annotations(rules.traces_dir(tmp_path / run)) == {"t-1": [update]}
    assert both.failures == {}


def test_a_row_takes_what_the_walk_dumped_of_the_episode() -> None:
    """The encoder dumps an episode's own fields (token counts: verifiers computes them over
    every call) as it writes it; the row takes them from there rather than again."""
    (record,) = maker_records(1, seed=21)
    episode = WireEpisode.model_validate(record)
    view = Records(4).value(episode)
    keep = TopFields.attach(view)
    assert keep is not None
    assert encoder.encode(view) == orjson.dumps(episode.to_record())
    assert keep.fields is not None
    assert keep.fields["num_input_tokens"] == episode.num_input_tokens
    assert episode_row(view, keep.fields) == episode_row(view)
    forged = {**keep.fields, "num_input_tokens": 12345}
    assert episode_row(view, forged)["input_tokens"] == 12345  # not computed again


@pytest.mark.anyio
@pytest.mark.usefixtures("wandb_offline")
async def test_prime_rl_reads_a_downloaded_wandb_run(tmp_path: Path) -> None:
    """The files a W&B run saved, downloaded with their paths, are a run directory prime-rl's
    rules read as FileMonitor's: every record, every row, the shipped cohort."""
    records = maker_records(6, seed=5)
    async with WandbMonitor(project="p", chunk_bytes=100_000) as monitor:
        await monitor.log_episodes(records[:4], step=0, subset="all")
        await monitor.log_episodes(records[4:], step=1, kind="eval", subset="all")
        await monitor.log_episodes(records[1:3], step=1)  # the shipped cohort
    assert monitor.run is not None
    copied = download(Path(monitor.run.dir), traces_saved(monitor), tmp_path / "dl")
    logged = [(r, "train", 0) for r in records[:4]] + [(r, "eval", 1) for r in records[4:]]
    check_with_prime_rl(copied, logged)
    updates = rules.read_annotations(rules.traces_dir(copied))
    assert set(updates) == {t["id"] for r in records[1:3] for t in r["traces"]}


@pytest.mark.anyio
async def test_every_annotation_is_written_or_counted_lost(tmp_path: Path) -> None:
    good = [rules.make_update(f"t-{n}", info={"n": n}) for n in range(3)]
    bad = rules.make_update("t-bad", info={"x": object()})  # orjson cannot write it
    async with FileMonitor(tmp_path / "run") as monitor:
        await monitor.log_annotations([good[0], bad, *good[1:]], step=1)
    assert monitor.annotation_stats() == DeliveryStats(4, 3, {"encode_error": 1})
    found = rules.read_annotations(rules.traces_dir(tmp_path / "run"))
    assert found == {u["trace_id"]: [u] for u in good}  # the rest went on
    (tmp_path / "file").write_text("not a directory")
    failed = FileMonitor(tmp_path / "file")
    with pytest.raises(TraceWriteError):
        await failed.start()
    await failed.log_annotations(good)
    await failed.finalize()
    assert failed.annotation_stats() == DeliveryStats(3, 0, {"start_failed": 3})
    both = Monitors(FileMonitor(tmp_path / "a"), failed)
    assert both.annotation_stats() == DeliveryStats(3, 0, {"start_failed": 3})


@pytest.mark.anyio
async def test_the_effective_cohort_counts_every_episode_whatever_its_id(tmp_path: Path) -> None:
    odd = [
        {"id": ["a", "list"], "traces": [{"id": "t-0"}]},  # not an id an episode is known by
        {"id": True, "traces": [{"id": "t-1"}]},
        {"traces": [{"id": "t-2"}]},
    ]
    async with FileMonitor(tmp_path / "run") as monitor:
        await monitor.log_episodes(odd, step=0, subset="all")
        await monitor.log_episodes(odd, step=0, subset="effective")  # written again: unknown
    assert monitor.stats() == DeliveryStats(6, 6, {})
    assert list(read_records(tmp_path / "run")) == odd + odd
    marks = rules.read_annotations(rules.traces_dir(tmp_path / "run"))
    assert sorted(marks) == ["t-0", "t-1", "t-2"]
    # A stream that cannot be opened: the whole cohort is counted lost.
    async with FileMonitor(tmp_path / "stray") as broken:
        broken.stream_dir.mkdir(parents=True)
        (broken.stream_dir / "notes.txt").write_text("not a chunk")
        with pytest.raises(TraceWriteError):
            await broken.log_episodes(odd, step=0, subset="effective")
        assert broken.stats() == DeliveryStats(3, 0, {"write_error": 3})


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
TRACE = st.fixed_dictionaries(
    {"id": st.sampled_from(["t", "u"]) | JSON},
    optional={
        "info": JSON,
        "nodes": st.lists(
            JSON
            | st.fixed_dictionaries({}, optional={"parent": JSON, "token_ids": JSON, "mask": JSON}),
            max_size=4,
        ),
    },
)
UPDATE = st.fixed_dictionaries(
    {"trace_id": st.sampled_from(["t", "u"])},
    optional={
        "info": JSON,
        "branches": st.lists(
            JSON
            | st.fixed_dictionaries(
                {"index": JSON}, optional={"advantages": JSON, "is_masked": JSON}
            ),
            max_size=3,
        ),
    },
)


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(
        JSON | st.fixed_dictionaries({}, optional={"traces": st.lists(TRACE | JSON, max_size=3)}),
        max_size=4,
    ),
    updates=st.lists(UPDATE, max_size=4),
)
def test_folding_any_records_with_any_updates_never_raises(
    records: list[Any], updates: list[Any]
) -> None:
    """Damaged or foreign records and updates fold or pass through: a reader never stops."""
    by_trace: dict[str, list[Any]] = {}
    for update in updates:
        by_trace.setdefault(update["trace_id"], []).append(update)
    before = copy.deepcopy(records)
    folded = list(fold(iter(records), by_trace))
    assert len(folded) == len(before)
    for got, was in zip(folded, before, strict=True):
        if not isinstance(was, dict):
            assert got == was


@settings(max_examples=300, deadline=None)
@given(
    record=JSON
    | st.fixed_dictionaries(
        {},
        optional={
            "id": JSON,
            "traces": st.lists(
                TRACE
                | st.fixed_dictionaries(
                    {}, optional={"rewards": JSON, "timing": JSON, "calls": JSON}
                ),
                max_size=3,
            ),
            "run": JSON,
            "errors": JSON,
        },
    )
)
def test_any_record_gets_a_row(record: Any) -> None:
    """A row never stops a record from being written, whatever the record holds."""
    row = episode_row(record)
    assert set(row) >= {"id", "kind", "line", "offset", "chunk", "reward", "trace_ids"}


def test_a_timing_tree_too_deep_to_walk_gets_a_row() -> None:
    deep: dict[str, Any] = {}
    for _ in range(5_000):
        deep = {"phase": deep}
    row = episode_row({"id": "x", "traces": [{"id": "t", "timing": deep}]})
    assert (row["id"], row["duration"]) == ("x", None)
