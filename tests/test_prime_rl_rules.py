"""Self-tests of ``prime_rl_rules``, the oracle for prime-rl's file-monitor layout.

Every expectation here is worked out by hand from prime-rl's rules, not by calling the
oracle a second way, so a slip in the oracle fails here before it can bless (or blame)
nodewise's layout. Nothing here imports nodewise: the oracle must stand on its own.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import orjson
import prime_rl_rules as rules
import pytest
import pyzstd
import verifiers.v1.graph as vf_graph  # type: ignore[import-untyped]
import verifiers.v1.trace as vf_trace  # type: ignore[import-untyped]
import verifiers.v1.types as vf_types  # type: ignore[import-untyped]
from verifiers.v1.configs.agent import WireAgentConfig  # type: ignore[import-untyped]
from verifiers.v1.episode import WireEpisode  # type: ignore[import-untyped]
from verifiers.v1.state import State  # type: ignore[import-untyped]
from verifiers.v1.task import WireTaskData  # type: ignore[import-untyped]

SUMMARY_KEYS = [
    "rewards",
    "metrics",
    "timing",
    "cost",
    "line",
    "offset",
    "id",
    "kind",
    "trace_ids",
    "env",
    "group",
    "ok",
    "num_errors",
    "reward",
    "advantage",
    "input_tokens",
    "output_tokens",
    "turns",
    "branches",
    "stop_condition",
    "truncated",
    "dispatch",
    "arrival",
    "duration",
]
INDEX_KEYS = [*SUMMARY_KEYS[3:], "chunk"]
#: The seekable format's seek table ends with this magic (little-endian), after a frame
#: count (4 bytes) and a descriptor byte.
SEEKABLE_MAGIC = 0x8F92EAB1


def small(i: int, pad: int = 8) -> dict[str, Any]:
    """A small episode-shaped record; ``i < 10`` keeps every line the same length."""
    return {
        "id": f"ep-{i}",
        "ok": True,
        "num_input_tokens": 10 + i,
        "num_output_tokens": i,
        "traces": [{"id": f"t-{i}", "rewards": {"r": {"score": 0.5, "weight": 1}}}],
        "pad": "x" * pad,
    }


def line_of(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)


def files(directory: Path) -> list[str]:
    return sorted(entry.name for entry in directory.iterdir())


# -- chunk numbering and the stray-file ValueError --------------------------------------


def test_a_stray_index_jsonl_in_the_stream_dir_raises(tmp_path: Path) -> None:
    stream = rules.write_prime_rl_stream(tmp_path, [small(0), small(1)], chunk_bytes=1 << 20)
    assert rules.chunk_numbers(stream) == {0: True}
    (stream / "index.jsonl").write_bytes(b"{}\n")
    with pytest.raises(ValueError, match="index"):
        rules.chunk_numbers(stream)
    with pytest.raises(ValueError, match="index"):
        list(rules.read_records(stream))


@pytest.mark.parametrize("name", ["lock.jsonl", "stream.jsonl.bak", "notes.jsonl.txt"])
def test_any_other_name_the_glob_matches_raises(tmp_path: Path, name: str) -> None:
    stream = rules.write_prime_rl_stream(tmp_path, [small(0)], chunk_bytes=1 << 20)
    (stream / name).write_bytes(b"")
    with pytest.raises(ValueError, match="invalid literal for int"):
        rules.chunk_numbers(stream)


def test_names_the_glob_does_not_match_are_ignored(tmp_path: Path) -> None:
    stream = rules.write_prime_rl_stream(tmp_path, [small(0)], chunk_bytes=1 << 20)
    (stream / "README").write_bytes(b"")
    (stream / "00003.json").write_bytes(b"")
    assert rules.chunk_numbers(stream) == {0: True}


def test_a_lone_tmp_is_counted_as_a_chunk_without_a_plain_file(tmp_path: Path) -> None:
    """prime-rl's glob matches ``NNNNN.jsonl.zst.tmp`` too: the number is listed, as a chunk
    with no plain file (so a reader would then look for the sealed twin)."""
    stream = rules.write_prime_rl_stream(tmp_path, [small(0)], chunk_bytes=1 << 20)
    (stream / "00009.jsonl.zst.tmp").write_bytes(b"")
    assert rules.chunk_numbers(stream) == {0: True, 9: False}
    with pytest.raises(FileNotFoundError):
        list(rules.read_records(stream))


# -- writing a stream and reading it back -----------------------------------------------


def test_chunks_roll_as_chunked_jsonl_does(tmp_path: Path) -> None:
    """A line goes to a new chunk only when the current one holds something and the line
    would take it past chunk_bytes; a line longer than chunk_bytes fills a chunk alone."""
    records = [small(0), small(1), small(2), small(3, pad=500), small(4)]
    width = len(line_of(small(0)))
    assert all(len(line_of(r)) == width for r in records if r["id"] != "ep-3")
    stream = rules.write_prime_rl_stream(tmp_path, records, chunk_bytes=2 * width)
    rows = rules.read_index(stream)
    assert [(row["chunk"], row["offset"]) for row in rows] == [
        (0, 0),
        (0, width),
        (1, 0),
        (2, 0),
        (3, 0),
    ]
    assert files(stream) == ["00000.jsonl", "00001.jsonl", "00002.jsonl", "00003.jsonl"]
    assert (stream / "00000.jsonl").read_bytes() == line_of(records[0]) + line_of(records[1])
    assert (stream / "00002.jsonl").read_bytes() == line_of(records[3])


def test_records_come_back_in_order_across_plain_and_sealed_chunks(tmp_path: Path) -> None:
    records = [small(i % 10, pad=40 * (i % 7)) for i in range(40)]
    stream = rules.write_prime_rl_stream(tmp_path, records, chunk_bytes=700, seal_upto=5)
    numbers = rules.chunk_numbers(stream)
    assert len(numbers) > 6
    assert {n: plain for n, plain in numbers.items() if n < 5} == dict.fromkeys(range(5), False)
    assert all(plain for n, plain in numbers.items() if n >= 5)
    for n in range(5):
        assert not (stream / f"{n:05d}.jsonl").exists()
        assert (stream / f"{n:05d}.jsonl.zst").is_file()
    assert list(rules.read_records(stream)) == records
    # the sealed bytes are the plain chunk's bytes, and a whole stream decompresses with zstd
    rows = rules.read_index(stream)
    first = b"".join(line_of(records[i]) for i, row in enumerate(rows) if row["chunk"] == 0)
    assert pyzstd.decompress((stream / "00000.jsonl.zst").read_bytes()) == first


def test_a_finished_stream_is_all_sealed(tmp_path: Path) -> None:
    records = [small(i) for i in range(6)]
    stream = rules.write_prime_rl_stream(tmp_path, records, chunk_bytes=300, seal_upto=1_000)
    assert files(stream) == [f"{n:05d}.jsonl.zst" for n in range(len(files(stream)))]
    assert not any(rules.chunk_numbers(stream).values())
    assert list(rules.read_records(stream)) == records


def test_a_sealed_chunk_is_seekable_zstd_in_4_mib_frames(tmp_path: Path) -> None:
    """About 9 MiB of records in one chunk: three frames in the seek table."""
    records = [
        {
            "id": f"big-{i}",
            "num_input_tokens": 1,
            "num_output_tokens": 1,
            "blob": f"{i}" * (3 << 20),
        }
        for i in range(3)
    ]
    stream = rules.write_prime_rl_stream(tmp_path, records, chunk_bytes=64 << 20, seal_upto=1)
    sealed = stream / "00000.jsonl.zst"
    tail = sealed.read_bytes()[-9:]
    frames, _descriptor, magic = struct.unpack("<IBI", tail)
    assert magic == SEEKABLE_MAGIC
    size = sum(len(line_of(r)) for r in records)
    assert size > 8 << 20
    assert frames == -(-size // rules.FRAME_BYTES) == 3
    rows = rules.read_index(stream)
    assert rules.read_at(stream, rows[2]) == records[2]


def test_a_torn_tail_ends_the_stream(tmp_path: Path) -> None:
    records = [small(i) for i in range(4)]
    stream = rules.write_prime_rl_stream(tmp_path, records, chunk_bytes=1 << 20)
    with (stream / "00000.jsonl").open("ab") as f:
        f.write(b'{"id": "torn", "traces": [')
    assert list(rules.read_records(stream)) == records
    # a torn line ends the stream even when whole lines follow in a later chunk
    (stream / "00001.jsonl").write_bytes(line_of(small(9)))
    assert list(rules.read_records(stream)) == records


def test_a_relaunch_carries_on_the_stream_and_its_numbering(tmp_path: Path) -> None:
    first = [small(i) for i in range(3)]
    stream = rules.write_prime_rl_stream(tmp_path, first, chunk_bytes=1 << 20)
    rules.write_prime_rl_stream(tmp_path, [small(3)], chunk_bytes=1 << 20)
    assert files(stream) == ["00000.jsonl"]  # the live chunk is appended to
    rules.write_prime_rl_stream(tmp_path, [small(4)], chunk_bytes=1 << 20, seal_upto=1)
    rules.write_prime_rl_stream(tmp_path, [small(5)], chunk_bytes=1 << 20)
    assert files(stream) == ["00000.jsonl.zst", "00001.jsonl"]  # a sealed last chunk is not
    rows = rules.read_index(stream)
    assert [row["line"] for row in rows] == [1, 2, 3, 4, 5, 6]
    assert [(row["chunk"], row["id"]) for row in rows][-2:] == [(0, "ep-4"), (1, "ep-5")]
    assert list(rules.read_records(stream)) == [small(i) for i in range(6)]


# -- the index ------------------------------------------------------------------------


def test_every_index_row_reads_the_record_at_its_line(tmp_path: Path) -> None:
    records = [small(i % 10, pad=30 * (i % 5)) for i in range(25)]
    stream = rules.write_prime_rl_stream(tmp_path, records, chunk_bytes=600, seal_upto=2)
    assert rules.index_path(stream) == stream.parent / "stream.index.jsonl"
    rows = rules.read_index(stream)
    assert [row["line"] for row in rows] == list(range(1, 26))
    assert len({row["chunk"] for row in rows}) > 3
    for row in rows:
        assert list(row) == INDEX_KEYS
        record = records[row["line"] - 1]
        assert rules.read_at(stream, row) == record
        assert row["id"] == record["id"]
        assert row["offset"] is not None
    raw = rules.index_path(stream).read_bytes().splitlines(keepends=True)
    assert raw[0] == orjson.dumps(
        rules.index_row(1, records[0], 0, 0), option=orjson.OPT_APPEND_NEWLINE
    )


def test_rows_left_out_of_the_index(tmp_path: Path) -> None:
    records = [small(i) for i in range(5)]
    stream = rules.write_prime_rl_stream(
        tmp_path, records, chunk_bytes=1 << 20, index_missing_last=2
    )
    assert [row["line"] for row in rules.read_index(stream)] == [1, 2, 3]
    assert list(rules.read_records(stream)) == records


def test_the_index_reader_stops_at_a_torn_or_bad_row(tmp_path: Path) -> None:
    stream = rules.write_prime_rl_stream(tmp_path, [small(0), small(1)], chunk_bytes=1 << 20)
    index = rules.index_path(stream)
    whole = index.read_bytes()
    index.write_bytes(whole + b'{"line": 3')
    assert len(rules.read_index(stream)) == 2
    index.write_bytes(whole + b'{"line": 3}')  # parses, but its newline is not written yet
    assert len(rules.read_index(stream)) == 2
    index.write_bytes(whole + b"not json\n" + whole)
    assert len(rules.read_index(stream)) == 2
    index.unlink()
    assert rules.read_index(stream) == []


def test_a_seal_in_progress_leaves_a_tmp_readers_pass_over(tmp_path: Path) -> None:
    records = [small(i) for i in range(12)]
    stream = rules.write_prime_rl_stream(
        tmp_path, records, chunk_bytes=400, seal_upto=1, tmp_chunk=1
    )
    assert "00001.jsonl.zst.tmp" in files(stream)
    assert "00001.jsonl" in files(stream)
    assert "00001.jsonl.zst" not in files(stream)
    assert (stream / "00001.jsonl.zst.tmp").stat().st_size > 0
    numbers = rules.chunk_numbers(stream)
    assert numbers[0] is False
    assert numbers[1] is True
    assert list(rules.read_records(stream)) == records
    for row in rules.read_index(stream):
        assert rules.read_at(stream, row) == records[row["line"] - 1]
    with pytest.raises(ValueError, match="no plain file"):
        rules.write_prime_rl_stream(tmp_path, [], chunk_bytes=400, tmp_chunk=0)


# -- what the dashboard lists ---------------------------------------------------------


def test_which_run_directories_the_dashboard_lists(tmp_path: Path) -> None:
    for name, marker in [
        ("monitors-run", "monitors"),
        ("configs-run", "configs"),
        ("logs-run", "logs"),
        ("bare-run", "traces.jsonl"),
        ("metrics-only", "metrics.jsonl"),
        (".hidden", "monitors"),
    ]:
        (tmp_path / name).mkdir()
        target = tmp_path / name / marker
        if marker.endswith(".jsonl"):
            target.write_bytes(b"")
        else:
            target.mkdir()
    (tmp_path / "configs-file").mkdir()
    (tmp_path / "configs-file" / "configs").write_bytes(b"")
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_bytes(b"")
    listed = sorted(p.name for p in tmp_path.iterdir() if rules.lists_run(p))
    assert listed == ["bare-run", "configs-file", "configs-run", "logs-run", "monitors-run"]


def test_when_the_dashboard_reads_a_chunked_stream(tmp_path: Path) -> None:
    stream = rules.stream_dir(tmp_path)
    assert not rules.lists_stream(stream)
    stream.mkdir(parents=True)
    (stream / "00000.jsonl").write_bytes(line_of(small(0)))
    assert not rules.lists_stream(stream)  # chunks without an index are not read
    rules.index_path(stream).write_bytes(b"")
    assert not rules.lists_stream(stream)  # nor with an empty one
    assert rules.run_stream(tmp_path) is None
    (tmp_path / "traces.jsonl").write_bytes(line_of(small(1)))
    assert rules.run_stream(tmp_path) == tmp_path / "traces.jsonl"
    rules.index_path(stream).write_bytes(b"{}\n")
    assert rules.lists_stream(stream)
    assert rules.run_stream(tmp_path) == stream
    # only the index is looked at: the directory itself may be missing
    other = tmp_path / "elsewhere" / "stream"
    other.parent.mkdir()
    rules.index_path(other).write_bytes(b"{}\n")
    assert rules.lists_stream(other)


def test_metrics_rows_as_prime_rl_writes_them(tmp_path: Path) -> None:
    rows = [{"step": 0, "time": 1.5, "loss": 0.25}, {"step": None, "time": 2.0, "tok/s": 10}]
    path = rules.write_prime_rl_metrics(tmp_path, rows)
    assert path == tmp_path / "monitors" / "file" / "metrics.jsonl"
    assert path.read_text() == (
        '{"step": 0, "time": 1.5, "loss": 0.25}\n{"step": null, "time": 2.0, "tok/s": 10}\n'
    )
    rules.write_prime_rl_metrics(tmp_path, [{"step": 1, "time": 3.0}])
    with path.open("a") as f:
        f.write('{"step": 2, "ti')
    assert rules.read_prime_rl_metrics(tmp_path) == [*rows, {"step": 1, "time": 3.0}]
    assert json.loads(path.read_text().splitlines()[0]) == rows[0]


# -- summarize_episode ----------------------------------------------------------------


def episode() -> dict[str, Any]:
    """Three traces: a trained one with two branches, a second seat, and a reward-less judge."""
    first = {
        "id": "ta",
        "info": {
            "kind": "train",
            "advantage": 0.5,
            "dispatch": {"time": 100.0},
            "arrival": {"time": 112.5},
        },
        "rewards": {
            "correct": {"score": 1.0, "weight": 0.5},
            "format": {"score": 0.5, "weight": None},
            "junk": 3,
        },
        "metrics": {"turns": 2, "label": "x"},
        "nodes": [
            {"message": {"role": "user"}},
            {"parent": 0, "message": {"role": "assistant"}},
            {"parent": 1, "message": {"role": "tool"}},
            {"parent": 2, "message": {"role": "assistant"}},
            {"parent": 0, "message": {"role": "assistant"}},
        ],
        "calls": [
            {"usage": {"cost": 0.25}, "finish_reason": "stop"},
            {"usage": {"cost": 0.5}, "finish_reason": "stop"},
            {"usage": {"cost": "n/a"}, "finish_reason": "length", "error": {"type": "Boom"}},
        ],
        "stop_condition": "agent_completed",
        "timing": {
            "start": 0.0,
            "end": 10.0,
            "agent": {"start": 1.0, "end": 4.0, "model": {"duration": 2.0}},
            "scoring": {"duration": 0.5},
        },
    }
    second = {
        "id": "tb",
        "info": {"advantage": -0.25},
        "rewards": {"correct": {"score": 0.0, "weight": 2.0}},
        "metrics": {"turns": 4},
        "nodes": [{"message": {"role": "user"}}, {"parent": 0, "message": {"role": "assistant"}}],
        "calls": [{"usage": {"cost": 1.0}, "finish_reason": "stop"}],
        "stop_condition": "max_turns",
        "timing": {"agent": {"duration": 1.5}},
    }
    # a reward-less seat; its one node's explicit null parent is still a distinct parent
    judge = {
        "rewards": {},
        "calls": [{"usage": None}],
        "nodes": [{"parent": None, "message": {"role": "system"}}],
    }
    return {
        "id": "ep-1",
        "env": {"id": "math", "name": "math-src"},
        "group": {"id": "g1"},
        "ok": False,
        "errors": [{"type": "A"}, {"type": "B"}],
        "run": {"type": "eval"},
        "num_input_tokens": 120,
        "num_output_tokens": 30,
        "traces": [first, second, judge],
    }


def test_summarize_episode_on_a_handcrafted_episode() -> None:
    summary = rules.summarize_episode(7, episode(), 123)
    assert list(summary) == SUMMARY_KEYS
    assert summary == {
        "rewards": {"correct": 0.5, "format": 0.5},  # scores averaged per name, unweighted
        "metrics": {"turns": 3.0},  # the non-numeric metric left out
        "timing": {"": 10.0, "agent": 4.5, "agent/model": 2.0, "scoring": 0.5},
        "cost": 1.75,  # 0.25 + 0.5 + 1.0; the non-numeric cost and the null usage skipped
        "line": 7,
        "offset": 123,
        "id": "ep-1",
        "kind": "train",  # the trace's stamp beats the run's type
        "trace_ids": ["ta", "tb"],
        "env": "math-src",
        "group": "g1",
        "ok": False,
        "num_errors": 2,
        "reward": 0.5,  # mean of 1.0*0.5 + 0.5*1 and 0.0*2.0; the judge has no rewards
        "advantage": 0.125,  # mean of 0.5 and -0.25
        "input_tokens": 120,
        "output_tokens": 30,
        "turns": 4,  # assistant nodes: three in ta, one in tb
        "branches": 3,  # ta: 5 nodes - 3 distinct parents; tb: 2 - 1; judge: 1 - 1 (None)
        "stop_condition": "max_turns",  # the last trace with the key; the judge has none
        "truncated": True,  # tb's max_turns
        "dispatch": 100.0,
        "arrival": 112.5,
        "duration": 12.5,
    }
    row = rules.index_row(7, episode(), 4, 123)
    assert list(row) == INDEX_KEYS
    assert row == {**{k: v for k, v in summary.items() if k in INDEX_KEYS}, "chunk": 4}


def test_duration_falls_back_to_the_top_level_phases() -> None:
    rec = episode()
    del rec["traces"][0]["info"]["arrival"]
    # "" (10.0) + agent (3.0 + 1.5) + scoring (0.5); agent/model is inside agent
    assert rules.summarize_episode(1, rec)["duration"] == 15.0
    for trace in rec["traces"]:
        trace.pop("timing", None)
    assert rules.summarize_episode(1, rec)["duration"] is None
    rec["traces"][0]["info"]["arrival"] = {"time": 90.0}  # before dispatch
    assert rules.summarize_episode(1, rec)["duration"] == 0.0


def test_kind_env_and_empty_episode_fallbacks() -> None:
    rec = episode()
    del rec["traces"][0]["info"]["kind"]
    assert rules.summarize_episode(1, rec)["kind"] == "eval"
    rec["run"] = {"type": "eval", "work": {"type": "train"}}
    assert rules.summarize_episode(1, rec)["kind"] == "train"
    del rec["run"]
    rec["traces"][1]["info"]["kind"] = "other"
    assert rules.summarize_episode(1, rec)["kind"] == "eval"
    del rec["env"]["name"]
    assert rules.summarize_episode(1, rec)["env"] == "math"
    rec["traces"][2]["stop_condition"] = None  # a null stop condition still counts as the last
    assert rules.summarize_episode(1, rec)["stop_condition"] is None
    bare = {"id": "e", "num_input_tokens": 0, "num_output_tokens": 0}
    summary = rules.summarize_episode(2, bare)
    assert summary["reward"] is None
    assert summary["advantage"] is None
    assert summary["cost"] is None
    assert summary["duration"] is None
    assert summary["stop_condition"] is None
    assert summary["truncated"] is False
    assert summary["trace_ids"] == []
    assert summary["offset"] is None


@pytest.mark.parametrize(
    ("trace", "truncated"),
    [
        ({"stop_condition": "max_output_tokens"}, True),
        ({"stop_condition": "compaction_failed", "calls": []}, True),
        ({"stop_condition": "agent_completed", "calls": [{"finish_reason": "length"}]}, True),
        ({"calls": [{"finish_reason": "length"}, {"finish_reason": "stop"}]}, False),
        (
            {"calls": [{"finish_reason": "length"}, {"finish_reason": "stop", "error": {"x": 1}}]},
            True,
        ),
        ({"calls": [{"finish_reason": "length", "error": {"x": 1}}]}, False),
        ({"stop_condition": "error", "calls": []}, False),
        ({"stop_condition": "agent_completed"}, False),
    ],
)
def test_trace_truncated(trace: dict[str, Any], truncated: bool) -> None:
    assert rules.trace_truncated(trace) is truncated
    rec = {"num_input_tokens": 1, "num_output_tokens": 1, "traces": [trace]}
    assert rules.summarize_episode(1, rec)["truncated"] is truncated


# -- the token fallback through verifiers ---------------------------------------------


def verifiers_episode() -> Any:
    """A small episode built with verifiers' own API: two prompts, two turns each, every
    model call with usage."""
    task = vf_trace.TraceTask[WireTaskData](
        type="Task", data=WireTaskData.model_validate({"prompt": "p", "n": 1})
    )
    agent = vf_trace.AgentInfo[WireAgentConfig](config=WireAgentConfig.model_validate({}))
    trace = vf_trace.Trace[WireTaskData, State, WireAgentConfig](task=task, agent=agent)
    for root in range(2):
        prompt: list[Any] = [vf_types.UserMessage(content=f"question {root}")]
        prompt_ids = [7] * 5  # each turn's prompt carries the branch's tokens so far
        for turn in range(2):
            pending = vf_graph.prepare_turn(trace, prompt)
            message = vf_types.AssistantMessage(content=f"answer {root}.{turn}")
            response = vf_types.Response(
                id=f"resp-{root}-{turn}",
                created=1_700_000_000,
                model="policy",
                message=message,
                finish_reason="stop",
                tokens=vf_types.TurnTokens(
                    prompt_ids=list(prompt_ids),
                    completion_ids=[1, 2, 3],
                    completion_logprobs=[-0.1, -0.2, -0.3],
                ),
            )
            node = pending.commit(response)
            usage = vf_types.Usage(prompt_tokens=len(prompt_ids), completion_tokens=3, cost=0.5)
            trace.calls.append(
                vf_trace.ModelCall(node=node, model="policy", usage=usage, finish_reason="stop")
            )
            prompt = [*prompt, message, vf_types.UserMessage(content="go on")]
            prompt_ids = [*prompt_ids, 1, 2, 3, 7, 7, 7, 7]
    trace.record_reward("correct", 1.0, 1.0)
    trace.stop("agent_completed")
    return WireEpisode(task=task, traces=[trace], ok=True)


def test_tokens_fall_back_to_verifiers_when_not_recorded() -> None:
    built = verifiers_episode()
    want_in, want_out = built.num_input_tokens, built.num_output_tokens
    assert want_in > 0
    assert want_out > 0
    rec = built.to_record()
    assert (rec["num_input_tokens"], rec["num_output_tokens"]) == (want_in, want_out)
    # recorded ints are taken as they are, not recomputed
    rec["num_input_tokens"], rec["num_output_tokens"] = 1_000_003, 7
    assert rules.summarize_episode(1, rec)["input_tokens"] == 1_000_003
    del rec["num_input_tokens"]
    summary = rules.summarize_episode(1, rec)
    assert (summary["input_tokens"], summary["output_tokens"]) == (want_in, want_out)
    rec["num_input_tokens"], rec["num_output_tokens"] = 5, "7"  # one not an int: both recomputed
    summary = rules.summarize_episode(1, rec)
    assert (summary["input_tokens"], summary["output_tokens"]) == (want_in, want_out)
    assert summary["turns"] == 4
    assert summary["branches"] == 2
    assert summary["cost"] == 2.0
    assert summary["reward"] == 1.0


# -- trace updates ----------------------------------------------------------------------


def test_make_update() -> None:
    assert rules.make_update("t") == {"version": 1, "trace_id": "t", "info": {}, "branches": []}
    update = rules.make_update("t", info={"a": 1}, branches={1: {"advantages": [0.5]}})
    assert update == {
        "version": 1,
        "trace_id": "t",
        "info": {"a": 1},
        "branches": [{"index": 1, "advantages": [0.5]}],
    }


def test_fold_merges_info_deep_and_the_newest_wins() -> None:
    trace: dict[str, Any] = {
        "id": "t",
        "info": {"kind": "train", "ship": {"step": 3, "batch": 1}, "x": 1, "y": {"z": 1}},
    }
    updates = [
        rules.make_update("t", info={"ship": {"step": 4}, "effective": True}),
        rules.make_update("t"),
        rules.make_update("t", info={"ship": {"extra": "e"}, "x": 2, "y": 5}),
    ]
    assert rules.fold_trace_updates(trace, updates) == 0
    assert trace["info"] == {
        "kind": "train",
        "ship": {"step": 4, "batch": 1, "extra": "e"},
        "x": 2,
        "y": 5,
        "effective": True,
    }
    assert list(trace["info"]) == ["kind", "ship", "x", "y", "effective"]
    assert list(trace["info"]["ship"]) == ["step", "batch", "extra"]
    bare: dict[str, Any] = {"id": "u"}
    rules.fold_trace_updates(bare, [rules.make_update("u")])
    assert "info" not in bare  # an empty info merges nothing
    rules.fold_trace_updates(bare, [rules.make_update("u", info={"a": {"b": 1}})])
    assert bare["info"] == {"a": {"b": 1}}


def branching_trace() -> dict[str, Any]:
    """Node 0 a prompt; nodes 1 and 2 two sampled answers to it: branches [0, 1], [0, 2]."""
    return {
        "id": "t",
        "nodes": [
            {"token_ids": [1, 2], "mask": [False, False]},
            {"parent": 0, "token_ids": [3, 4, 5], "mask": [False, True, True]},
            {"parent": 0, "token_ids": [6, 7], "mask": [True, True]},
        ],
    }


def test_branch_streams_land_on_the_sampled_tokens_of_their_nodes() -> None:
    trace = branching_trace()
    assert rules.branch_node_paths(trace["nodes"]) == [[0, 1], [0, 2]]
    updates = [
        rules.make_update("t", branches={0: {"trainer_logprobs": [None, None, 9.0, -0.1, -0.2]}}),
        rules.make_update(
            "t",
            branches={
                1: {
                    "trainer_logprobs": [0.0, 0.0, None, -0.3],  # a null: node 2 left alone
                    "is_masked": [None, None, None, True],  # partial: nulls kept
                    "mismatch_kl": [None, None, None, None],  # partial but all null: left
                    "advantages": [0.0, 0.0, 0.5],  # too short for node 2: left
                },
                5: {"trainer_logprobs": [1.0] * 9},  # no such branch
            },
        ),
        rules.make_update("t", branches={0: {"trainer_logprobs": [0, 0, 0, -0.7, -0.8]}}),
    ]
    assert rules.fold_trace_updates(trace, updates) == 1
    first, second, third = trace["nodes"]
    assert "trainer_logprobs" not in first  # nothing sampled
    assert second["trainer_logprobs"] == [-0.7, -0.8]  # the newest update wins
    assert "trainer_logprobs" not in third
    assert third["is_masked"] == [None, True]
    assert "mismatch_kl" not in third
    assert "advantages" not in third


def test_annotations_are_read_through_each_producers_index(tmp_path: Path) -> None:
    trainer = [
        rules.make_update("t1", info={"ship": {"step": 2}, "effective": True}),
        rules.make_update("t2", info={"advantage": 0.1}),
        rules.make_update("t1", info={"ship": {"step": 3}}),
    ]
    judge = [rules.make_update("t1", info={"judge": "yes", "ship": {"by": "judge"}})]
    rules.write_prime_rl_annotations(tmp_path, "trainer", trainer, chunk_bytes=120, seal_upto=1)
    rules.write_prime_rl_annotations(tmp_path, "a-judge", judge)
    traces = rules.traces_dir(tmp_path)
    annotations = rules.annotations_dir(traces)
    assert sorted(p.name for p in annotations.iterdir()) == [
        "a-judge",
        "a-judge.index.jsonl",
        "trainer",
        "trainer.index.jsonl",
    ]
    assert len(rules.chunk_numbers(annotations / "trainer")) == 3
    rows = rules.read_index(annotations / "trainer")
    assert rows[1] == {"trace_id": "t2", "chunk": 1, "offset": 0, "info": {"advantage": 0.1}}
    by_trace = rules.read_annotations(traces)
    # producers in name order, each in write order
    assert by_trace == {"t1": [judge[0], trainer[0], trainer[2]], "t2": [trainer[1]]}
    assert rules.read_annotations(traces, through_index=False) == by_trace
    # an update whose index row is missing is not seen through the index
    index = rules.index_path(annotations / "trainer")
    index.write_bytes(b"".join(index.read_bytes().splitlines(keepends=True)[:-1]))
    assert rules.read_annotations(traces)["t1"] == [judge[0], trainer[0]]
    assert rules.read_annotations(traces, through_index=False)["t1"][-1] == trainer[2]

    record = {"id": "ep", "traces": [{"id": "t1", "info": {"kind": "train"}}, {"id": "t3"}]}
    folded = rules.fold(record, rules.read_annotations(traces))
    assert folded["traces"][0]["info"] == {
        "kind": "train",
        "judge": "yes",
        "ship": {"by": "judge", "step": 2},
        "effective": True,
    }
    assert folded["traces"][1] == {"id": "t3"}
    assert record["traces"][0]["info"] == {"kind": "train"}  # the record itself untouched
