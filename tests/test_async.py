"""The async drivers: asyncio and trio, async iterables, loop lag, concurrent mutation."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import given
from strategies import (
    any_values,
    budgets,
    check_chunks,
    chunk_sizes,
    collect_async,
    custom_default,
    json_values,
    options,
)

import encoder
from encoder import EncodeError, adump, aiterencode, encode, iterencode

BACKENDS = ["asyncio", "trio"]
BIG = "b" * 100_000


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- parity under both loops --------------------------------------------------------------------


@given(value=json_values(), option=options, chunk_size=chunk_sizes, budget=budgets)
def test_aiterencode_parity_trio(value: Any, option: int, chunk_size: int, budget: float) -> None:
    try:
        expected = orjson.dumps(value, option=option)
    except orjson.JSONEncodeError:
        with pytest.raises(EncodeError):
            collect_async(
                value, backend="trio", option=option, chunk_size=chunk_size, budget=budget
            )
        return
    chunks = collect_async(
        value, backend="trio", option=option, chunk_size=chunk_size, budget=budget
    )
    check_chunks(chunks, chunk_size)
    assert b"".join(chunks) == expected


@given(value=any_values(errors=False), chunk_size=chunk_sizes, budget=budgets)
def test_adump_parity(value: Any, chunk_size: int, budget: float) -> None:
    option = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    try:
        expected = orjson.dumps(value, option=option, default=custom_default)
    except orjson.JSONEncodeError:
        expected = None
    written: list[bytes] = []

    async def write(chunk: bytes) -> None:
        written.append(chunk)
        await anyio.sleep(0)

    async def main() -> int:
        return await adump(
            value,
            write,
            option=option,
            default=custom_default,
            chunk_size=chunk_size,
            budget=budget,
        )

    if expected is None:
        with pytest.raises(EncodeError):
            anyio.run(main)
        return
    n = anyio.run(main)
    check_chunks(written, chunk_size)
    assert b"".join(written) == expected
    assert n == len(expected)


@pytest.mark.parametrize("chunk_size", [1, 1000, 65536])
def test_big_document_both_loops(backend: str, chunk_size: int) -> None:
    value = {
        "text": [BIG, "é" * 70_000, "😀" * 70_000],
        "numbers": list(range(20_000)),
        "floats": [i / 7 for i in range(10_000)],
        "rows": [{"id": i, "name": f"n{i}", "tags": ["a", "b"]} for i in range(3000)],
    }
    expected = orjson.dumps(value)
    chunks = collect_async(value, backend=backend, chunk_size=chunk_size, budget=1e-4)
    check_chunks(chunks, chunk_size)
    assert b"".join(chunks) == expected


def test_adump_counts_bytes_both_loops(backend: str) -> None:
    value = {"a": [BIG] * 5, "n": list(range(10_000))}
    expected = orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
    written = bytearray()

    async def write(chunk: bytes) -> None:
        written.extend(chunk)

    async def main() -> int:
        return await adump(value, write, option=orjson.OPT_APPEND_NEWLINE, chunk_size=3000)

    assert anyio.run(main, backend=backend) == len(expected)
    assert bytes(written) == expected


# -- async iterables and generators -------------------------------------------------------------


async def agen_records(n: int) -> AsyncIterator[Any]:
    for i in range(n):
        await anyio.sleep(0)
        yield {"i": i, "text": BIG if i % 3 == 0 else f"r{i}", "nums": list(range(i % 50))}


async def agen_plain(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


def records(n: int) -> list[Any]:
    return [
        {"i": i, "text": BIG if i % 3 == 0 else f"r{i}", "nums": list(range(i % 50))}
        for i in range(n)
    ]


@pytest.mark.parametrize("n", [0, 1, 7, 40])
@pytest.mark.parametrize("option", [0, orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS])
def test_async_iterable_encodes_as_array(backend: str, n: int, option: int) -> None:
    expected = orjson.dumps(records(n), option=option)
    chunks = collect_async(
        agen_records(n), backend=backend, option=option, iterables=True, chunk_size=5000
    )
    check_chunks(chunks, 5000)
    assert b"".join(chunks) == expected


def test_nested_async_and_sync_iterables(backend: str) -> None:
    def gen(n: int) -> Iterator[Any]:
        yield from range(n)

    value = {
        "a": agen_plain([1, agen_plain(["x", BIG]), gen(3), []]),
        "b": [gen(5000), agen_plain([])],
        "c": (x * 2 for x in range(10)),
        "d": agen_records(5),
    }
    expected = orjson.dumps(
        {
            "a": [1, ["x", BIG], [0, 1, 2], []],
            "b": [list(range(5000)), []],
            "c": [x * 2 for x in range(10)],
            "d": records(5),
        }
    )
    chunks = collect_async(value, backend=backend, iterables=True, chunk_size=4096)
    check_chunks(chunks, 4096)
    assert b"".join(chunks) == expected


def test_async_iterable_with_default_items(backend: str) -> None:
    from strategies import Custom

    value = [agen_plain([Custom({"k": BIG}), Custom([1, 2]), 3])]
    expected = orjson.dumps([[{"k": BIG}, [1, 2], 3]])
    data = b"".join(collect_async(value, backend=backend, iterables=True, default=custom_default))
    assert data == expected


def test_async_iterable_error_in_item_has_path(backend: str) -> None:
    async def items() -> AsyncIterator[Any]:
        yield 1
        yield {"ok": [BIG]}
        yield {"bad": object()}

    with pytest.raises(EncodeError) as info:
        collect_async({"stream": items()}, backend=backend, iterables=True)
    assert info.value.path == "$.stream[2].bad"


def test_async_iterable_raising_propagates(backend: str) -> None:
    class Broken(Exception):
        pass

    async def items() -> AsyncIterator[Any]:
        yield 1
        raise Broken("source failed")

    with pytest.raises(Broken):
        collect_async([items()], backend=backend, iterables=True)


def test_async_iterable_without_iterables_flag_is_refused(backend: str) -> None:
    async def consume(source: Any) -> None:
        async with aclosing(aiterencode([source])) as chunks:
            async for _ in chunks:
                pass

    async def main() -> None:
        source = agen_plain([1, 2])
        try:
            with pytest.raises(EncodeError):
                await consume(source)
        finally:
            await source.aclose()

    anyio.run(main, backend=backend)


def test_sync_iterencode_of_async_iterable_raises() -> None:
    async def never() -> AsyncIterator[int]:
        yield 1

    for run in (
        lambda v: list(iterencode(v, iterables=True)),
        lambda v: encode(v, iterables=True),
    ):
        source = never()
        with pytest.raises(EncodeError) as info:
            run({"stream": [0, source]})
        assert info.value.path == "$.stream[1]"
        with pytest.raises(EncodeError):
            run(never())


@pytest.mark.parametrize("chunk_size", [1, 64, 65536])
def test_generators_with_iterables_sync_and_async(chunk_size: int) -> None:
    def make() -> Any:
        return {
            "small": (i for i in range(10)),
            "big": (i * 0.5 for i in range(20_000)),
            "strings": (BIG for _ in range(3)),
            "nested": ((j for j in range(i)) for i in range(5)),
            "iter": iter([1, "two", None]),
            "map": map(str, range(3)),
            "empty": iter(()),
        }

    expected = orjson.dumps(
        {
            "small": list(range(10)),
            "big": [i * 0.5 for i in range(20_000)],
            "strings": [BIG] * 3,
            "nested": [list(range(i)) for i in range(5)],
            "iter": [1, "two", None],
            "map": ["0", "1", "2"],
            "empty": [],
        }
    )
    chunks = list(iterencode(make(), iterables=True, chunk_size=chunk_size))
    check_chunks(chunks, chunk_size)
    assert b"".join(chunks) == expected
    assert encode(make(), iterables=True) == expected
    for backend in BACKENDS:
        assert b"".join(collect_async(make(), backend=backend, iterables=True)) == expected


def test_generators_refused_without_iterables() -> None:
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(iter(range(3)))
    with pytest.raises(EncodeError):
        list(iterencode({"g": (x for x in range(3))}))
    with pytest.raises(EncodeError):
        collect_async({"g": (x for x in range(3))})


# -- event-loop lag -----------------------------------------------------------------------------


def _lag_document() -> dict[str, Any]:
    """~30 MB of JSON out of a few shared objects (small in memory)."""
    ascii_text = "a" * 200_000
    unicode_text = "é漢😀" * 50_000
    escapes = '"\\\n\t\x01' * 20_000
    ints = list(range(50_000))
    floats = [i / 3 for i in range(20_000)]
    rows = [{"id": i, "name": f"row {i}", "score": i * 0.25} for i in range(2000)]
    return {
        f"doc{i}": {
            "text": (ascii_text, unicode_text, escapes)[i % 3],
            "ints": ints,
            "floats": floats,
            "rows": rows,
        }
        for i in range(35)
    }


def test_loop_lag_stays_small_under_asyncio() -> None:
    """While aiterencode runs at the default budget, another task never waits 50 ms.

    A loose regression bound (the target is ~3 ms max); the gaps are measured by a
    task that loops on ``asyncio.sleep(0)``, with the garbage collector on. A gap counts by
    the lesser of its wall time and the thread's CPU time in it: a step of the encoder takes
    both, a shared host that stops the machine for a while (seen for up to 1.5 s) only the
    first.
    """
    value = _lag_document()
    expected_len = len(orjson.dumps(value))
    assert expected_len > 30_000_000

    async def main() -> tuple[int, float, int, float]:
        done = False
        gaps: list[float] = []

        async def probe() -> None:
            last, last_cpu = time.perf_counter(), time.thread_time()
            while not done:
                await asyncio.sleep(0)
                now, cpu = time.perf_counter(), time.thread_time()
                gaps.append(min(now - last, cpu - last_cpu))
                last, last_cpu = now, cpu

        probe_task = asyncio.create_task(probe())
        await asyncio.sleep(0)
        total = 0
        started = time.thread_time()
        async with aclosing(aiterencode(value)) as chunks:
            async for chunk in chunks:
                total += len(chunk)
        cpu = time.thread_time() - started
        done = True
        await probe_task
        return total, max(gaps), len(gaps), cpu

    assert gc.isenabled()
    total, worst, turns, cpu = anyio.run(main, backend="asyncio")
    assert total == expected_len
    # The probe gets a turn after each budget's worth of encoding: 240-280 turns in ~67 ms
    # of CPU here, one per 1.6 budgets. The floor, one per 10, scales with that CPU time (a
    # faster machine encodes in fewer budgets, so takes fewer turns).
    assert turns > cpu / (10 * encoder.DEFAULT_BUDGET), (turns, cpu)
    # The worst gap is 0.7-0.9 ms here, idle or with both cores busy.
    assert worst < 0.050, f"the loop stalled for {worst * 1000:.1f} ms"


# -- containers changed while they are encoded --------------------------------------------------


def _mutating_run(value: Any, mutate: Any, backend: str) -> BaseException | None:
    """Encode ``value`` with a tiny budget while another task calls ``mutate()`` once the
    first chunk is out; return what the encoder raised (None if it finished)."""

    async def main() -> BaseException | None:
        first_chunk = anyio.Event()
        raised: list[BaseException] = []
        finished = anyio.Event()

        async def encode_it() -> None:
            try:
                async with aclosing(aiterencode(value, budget=1e-6, chunk_size=1024)) as chunks:
                    async for _ in chunks:
                        first_chunk.set()
            except EncodeError as exc:
                raised.append(exc)
            finally:
                finished.set()

        async def mutate_it() -> None:
            await first_chunk.wait()
            if not finished.is_set():
                mutate()

        async with anyio.create_task_group() as tg:
            tg.start_soon(encode_it)
            tg.start_soon(mutate_it)
        return raised[0] if raised else None

    return anyio.run(main, backend=backend)


def test_dict_changing_size_while_encoded(backend: str) -> None:
    value = {f"key{i}": f"v{i}" for i in range(100_000)}
    err = _mutating_run(value, lambda: value.__setitem__("added", 1), backend)
    assert isinstance(err, EncodeError)
    assert "changed size" in err.message


def test_dict_shrinking_while_encoded(backend: str) -> None:
    value = {f"key{i}": f"v{i}" for i in range(100_000)}
    err = _mutating_run(value, lambda: value.pop("key99999"), backend)
    assert isinstance(err, EncodeError)
    assert "changed size" in err.message


def test_nested_dict_changing_size_while_encoded(backend: str) -> None:
    inner = {f"key{i}": f"v{i}" for i in range(100_000)}
    value = {"outer": [1, {"inner": inner}]}
    err = _mutating_run(value, lambda: inner.__setitem__("added", 1), backend)
    assert isinstance(err, EncodeError)
    assert "changed size" in err.message
    assert err.path.startswith("$.outer[1].inner")


def test_list_changing_size_while_encoded(backend: str) -> None:
    value = [f"v{i}" for i in range(100_000)]
    err = _mutating_run(value, lambda: value.append("added"), backend)
    assert isinstance(err, EncodeError)
    assert "changed size" in err.message


def test_list_shrinking_while_encoded(backend: str) -> None:
    value = [f"v{i}" for i in range(100_000)]
    err = _mutating_run(value, value.pop, backend)
    assert isinstance(err, EncodeError)
    assert "changed size" in err.message


def test_unchanged_container_with_concurrent_reader_is_fine(backend: str) -> None:
    value = {f"key{i}": f"v{i}" for i in range(100_000)}
    assert _mutating_run(value, lambda: len(value), backend) is None


# -- budget behaviour ---------------------------------------------------------------------------


def test_tiny_budget_gives_many_turns(backend: str) -> None:
    value = {"rows": [{"i": i, "s": "x" * 100} for i in range(20_000)], "big": [BIG] * 20}
    expected = orjson.dumps(value)

    async def main() -> tuple[bytes, int]:
        turns = 0
        done = False

        async def probe() -> None:
            nonlocal turns
            while not done:
                await anyio.sleep(0)
                turns += 1

        out: list[bytes] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(probe)
            async with aclosing(aiterencode(value, budget=1e-6)) as chunks:
                async for chunk in chunks:
                    out.append(chunk)
            done = True
        return b"".join(out), turns

    data, turns = anyio.run(main, backend=backend)
    assert data == expected
    assert turns > 20


def test_default_budget_is_positive_and_small() -> None:
    assert 0 < encoder.DEFAULT_BUDGET <= 0.002
