"""Fuzz target: ``encoder.encode`` and ``encoder.iterencode`` against ``orjson.dumps``.

The input is read as JSON when it parses (the seeds are real documents), and always as a
recipe for a structured value (``atheris.FuzzedDataProvider``): nested containers, str with
lone surrogates, ints past 64 bits, special floats, subclasses, long strings and long number
lists (which the walker cuts into slices). For every value and option set, our bytes equal
orjson's for any chunk size, or both refuse it (ours with ``EncodeError``). Anything else
raised is a crash.

    python fuzz/encode.py [libFuzzer flags] [corpus dirs]   (or: make fuzz)
"""

from __future__ import annotations

import enum
import json
import sys
from typing import Any

import atheris
from _repeatable import number_counters_repeatably, uninstrument

number_counters_repeatably()
with atheris.instrument_imports():
    import orjson

    import encoder
    from encoder._walk import Walker

# Its branches follow object addresses (cycle detection, by region of memory), which change
# with every process: the fuzzer must not steer by them.
uninstrument(Walker.enter_container)

OPTIONS = (
    orjson.OPT_INDENT_2,
    orjson.OPT_SORT_KEYS,
    orjson.OPT_NON_STR_KEYS,
    orjson.OPT_STRICT_INTEGER,
    orjson.OPT_APPEND_NEWLINE,
    orjson.OPT_PASSTHROUGH_SUBCLASS,
)
SPECIAL_FLOATS = (
    0.0,
    -0.0,
    float("nan"),
    float("inf"),
    -float("inf"),
    5e-324,
    1.7976931348623157e308,
)


class Str(str):
    pass


class Int(int):
    pass


class Color(enum.Enum):
    RED = "red"
    BIG = 1 << 70


class Budget:
    """Nodes a built value may still have (long lists inside long lists grow fast)."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes


def build(fdp: atheris.FuzzedDataProvider, budget: Budget, depth: int = 0) -> Any:
    budget.nodes -= 1
    kind = fdp.ConsumeIntInRange(0, 15 if depth < 5 and budget.nodes > 0 else 9)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 10))  # up to 80 bits: past 64 too
    if kind == 3:
        return fdp.ConsumeRegularFloat()
    if kind == 4:
        return SPECIAL_FLOATS[fdp.ConsumeIntInRange(0, len(SPECIAL_FLOATS) - 1)]
    if kind == 5:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 64))
    if kind == 6:
        return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 16))  # lone surrogates, sometimes
    if kind == 7:
        piece = fdp.ConsumeUnicode(fdp.ConsumeIntInRange(1, 8)) or "x"
        return piece * (70_000 // len(piece) + 1)  # longer than one string slice
    if kind == 8:
        return (
            Str(fdp.ConsumeUnicodeNoSurrogates(8)) if fdp.ConsumeBool() else Int(fdp.ConsumeInt(4))
        )
    if kind == 9:
        return Color.RED if fdp.ConsumeBool() else Color.BIG
    if kind == 10:
        n = fdp.ConsumeIntInRange(4097, 9000)  # longer than one number slice
        pool = [fdp.ConsumeInt(2), fdp.ConsumeRegularFloat() if fdp.ConsumeBool() else 7]
        numbers: list[Any] = [pool[i % 2] for i in range(n)]
        if fdp.ConsumeBool():
            numbers[fdp.ConsumeIntInRange(0, n - 1)] = build(fdp, budget, depth + 1)  # an intruder
        return numbers
    n = fdp.ConsumeIntInRange(0, 6)
    if kind == 11:
        return [build(fdp, budget, depth + 1) for _ in range(n)]
    if kind == 12:
        return tuple(build(fdp, budget, depth + 1) for _ in range(n))
    if kind == 13:
        return {fdp.ConsumeUnicode(6): build(fdp, budget, depth + 1) for _ in range(n)}
    if kind == 14:
        keys = (fdp.ConsumeInt(2), fdp.ConsumeRegularFloat(), None, True, fdp.ConsumeUnicode(3))
        return {keys[fdp.ConsumeIntInRange(0, 4)]: build(fdp, budget, depth + 1) for _ in range(n)}
    return [build(fdp, budget, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 300))]


def check(value: Any, option: int, chunk_size: int) -> None:
    deep = False
    try:
        expected: bytes | None = orjson.dumps(value, option=option)
    except orjson.JSONEncodeError as exc:
        expected = None
        # Nesting deeper than orjson's 254 levels: we write it (on purpose); it must parse back.
        deep = "Recursion limit" in str(exc)
    try:
        whole = encoder.encode(value, option=option)
        chunks = list(encoder.iterencode(value, option=option, chunk_size=chunk_size))
    except encoder.EncodeError:
        if expected is not None:
            raise AssertionError("EncodeError where orjson encodes the value") from None
        return
    if deep:
        assert json.loads(whole) == value, "a value deeper than orjson goes does not parse back"
        expected = whole
    if expected is None:
        raise AssertionError("encoded a value orjson refuses")
    assert whole == expected, "encode differs from orjson.dumps"
    assert b"".join(chunks) == expected, "iterencode differs from orjson.dumps"
    assert all(0 < len(c) <= chunk_size for c in chunks), "a chunk is empty or too long"


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    option = 0
    for flag in OPTIONS:
        if fdp.ConsumeBool():
            option |= flag
    chunk_size = fdp.ConsumeIntInRange(1, 70_000)
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    else:
        check(parsed, option, chunk_size)
    check(build(fdp, Budget(2000)), option, chunk_size)


def main() -> None:
    sys.setrecursionlimit(10_000)  # json.loads of documents orjson.loads accepts (<= 1024 deep)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
