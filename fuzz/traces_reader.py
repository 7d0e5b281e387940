"""Fuzz target: the trace reader on chunk files holding arbitrary bytes.

Each input becomes a stream directory: whole records (from a structured recipe), then
arbitrary bytes (a torn tail, garbage lines), split over one to three chunk files. The reader,
in both error modes, with small read blocks and ``big_line`` so that ijson reads some lines, must return
exactly the complete lines that are JSON, in order (never the bytes after the last newline of
the last chunk), and fail only with ``TraceFormatError`` where a line is not one JSON value.
Anything else raised, or a hang, is a crash.

    python fuzz/traces_reader.py [libFuzzer flags] [corpus dirs]   (or: make fuzz)
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp  # noqa: F401  (monitors imports it; the reader never runs it: not instrumented)
import atheris
from _repeatable import number_counters_repeatably

number_counters_repeatably()
with atheris.instrument_imports():
    import orjson

    from monitors.errors import TraceFormatError
    from monitors.traces import TraceReader, _reader
    from monitors.traces._layout import chunk_path

ROOT = Path(tempfile.mkdtemp(prefix="fuzz-traces-reader-"))
# The reader's sentinel is random per process, and the fuzzer learns the values its inputs
# are compared with: a fixed one keeps a run's inputs the same from one process to the next.
_reader._SENTINEL = 0x9E3779B97F4A7C1 | 1 << 60
_SURROGATE_ESCAPE = re.compile(rb"\\u([dD][89a-fA-F])")


def record(fdp: atheris.FuzzedDataProvider) -> Any:
    kind = fdp.ConsumeIntInRange(0, 4)
    if kind == 0:
        return fdp.ConsumeInt(8)  # up to 64 bits: what orjson writes
    if kind == 1:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 80))
    if kind == 2:
        return [fdp.ConsumeRegularFloat() for _ in range(fdp.ConsumeIntInRange(0, 5))]
    if kind == 3:
        return {"id": fdp.ConsumeInt(4), "text": fdp.ConsumeUnicodeNoSurrogates(40)}
    return None


def expected_of(chunks: list[bytes]) -> list[tuple[bool, Any]]:
    """What the reader owes: (True, record) per complete JSON line, (False, None) per bad one."""
    owed: list[tuple[bool, Any]] = []
    for n, data in enumerate(chunks):
        *lines, tail = data.split(b"\n")
        for line in lines:
            try:
                owed.append((True, orjson.loads(line)))
            except orjson.JSONDecodeError:
                owed.append((False, None))
        if tail and n < len(chunks) - 1:
            owed.append((False, None))  # a line cut short before the last chunk
    return owed


def same(a: Any, b: Any) -> bool:
    # ijson reads numbers as Decimal, turned into floats: compare as orjson writes them.
    return orjson.dumps(a) == orjson.dumps(b)


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    lines = [orjson.dumps(record(fdp)) + b"\n" for _ in range(fdp.ConsumeIntInRange(0, 8))]
    big_line = fdp.ConsumeIntInRange(0, 64)
    # Small read blocks, so that lines straddle them and long ones go through ijson.
    _reader._BLOCK = fdp.ConsumeIntInRange(1, 64)
    cuts = sorted(fdp.ConsumeIntInRange(0, 1 << 16) for _ in range(fdp.ConsumeIntInRange(0, 2)))
    stream = b"".join(lines) + fdp.ConsumeBytes(fdp.remaining_bytes())
    # Known and left alone: ijson reads a surrogate escape ("\ud800") as "?" where orjson
    # refuses it; our writer never writes one (orjson refuses lone surrogates).
    stream = _SURROGATE_ESCAPE.sub(rb"\\u0\1", stream)
    chunks = [stream[i:j] for i, j in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    directory = ROOT / "stream"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    for n, chunk in enumerate(chunks):
        chunk_path(directory, n).write_bytes(chunk)
    owed = expected_of(chunks)

    got: list[Any] = []
    reader = TraceReader(directory, big_line=big_line)
    try:
        for value in reader:
            got.append(value)
    except TraceFormatError:
        assert len(got) < len(owed), "an error past the last line"
        assert not owed[len(got)][0], "an error on a good line"
    else:
        assert all(ok for ok, _ in owed), "a bad line was not reported"
    assert len(got) <= len(owed)
    assert all(same(g, r) for g, (_, r) in zip(got, owed, strict=False)), "a record differs"

    skipping = TraceReader(directory, on_error="skip", big_line=big_line)
    kept = list(skipping)
    good = [r for ok, r in owed if ok]
    assert len(kept) == len(good), "skip mode kept a different number of records"
    assert all(same(k, r) for k, r in zip(kept, good, strict=True)), "a kept record differs"
    assert skipping.skipped == len(owed) - len(good), "skipped lines miscounted"


def main() -> None:
    try:
        atheris.Setup(sys.argv, test_one_input)
        atheris.Fuzz()
    finally:
        shutil.rmtree(ROOT, ignore_errors=True)


if __name__ == "__main__":
    main()
