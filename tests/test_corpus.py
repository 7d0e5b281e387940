"""The standard benchmark documents and the Big List of Naughty Strings, against orjson."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from conftest import JSON_FILES
from strategies import check_chunks, collect_async

from encoder import EncodeError, encode, iterencode

OPTIONS = {
    "plain": 0,
    "indent-sorted": orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS,
    "newline": orjson.OPT_APPEND_NEWLINE,
}
CHUNK_SIZES = [1, 7, 4096, 65536]

CASES = [
    pytest.param(name, size, opt, id=f"{name}-{size}-{opt_name}")
    for name in JSON_FILES
    for size in CHUNK_SIZES
    if size != 1 or name == "github.json"  # one-byte chunks only for the small document
    for opt_name, opt in OPTIONS.items()
]


@pytest.mark.parametrize(("name", "chunk_size", "option"), CASES)
def test_corpus_document(
    load_corpus: Callable[[str], Any], name: str, chunk_size: int, option: int
) -> None:
    expected = orjson.dumps(load_corpus(name), option=option)
    chunks = list(iterencode(load_corpus(name), option=option, chunk_size=chunk_size))
    check_chunks(chunks, chunk_size)
    assert b"".join(chunks) == expected


@pytest.mark.parametrize("name", JSON_FILES)
@pytest.mark.parametrize("option", list(OPTIONS.values()), ids=list(OPTIONS))
def test_corpus_document_async_and_encode(
    load_corpus: Callable[[str], Any], name: str, option: int
) -> None:
    expected = orjson.dumps(load_corpus(name), option=option)
    assert encode(load_corpus(name), option=option) == expected
    chunks = collect_async(load_corpus(name), option=option, chunk_size=4096, budget=1e-4)
    check_chunks(chunks, 4096)
    assert b"".join(chunks) == expected


@pytest.mark.parametrize("name", JSON_FILES)
def test_corpus_document_as_one_big_list(load_corpus: Callable[[str], Any], name: str) -> None:
    """Several copies side by side (big enough for every grouping step of the walker)."""
    value = [load_corpus(name) for _ in range(3)]
    assert b"".join(iterencode(value, chunk_size=10_000)) == orjson.dumps(value)


# -- Big List of Naughty Strings ----------------------------------------------------------------


def _compare(value: Any, *, option: int = 0, chunk_size: int = 65536) -> str | None:
    """None when every driver agrees with orjson (bytes, or both raising), else why not."""
    try:
        expected: bytes | None = orjson.dumps(value, option=option)
    except orjson.JSONEncodeError:
        expected = None
    try:
        ours: bytes | None = b"".join(iterencode(value, option=option, chunk_size=chunk_size))
    except EncodeError:
        ours = None
    if ours != expected:
        return f"iterencode: {ours!r:.80} != orjson {expected!r:.80}"
    try:
        whole: bytes | None = encode(value, option=option)
    except EncodeError:
        whole = None
    if whole != expected:
        return f"encode: {whole!r:.80} != orjson {expected!r:.80}"
    return None


def test_blns_is_loaded(blns: list[str]) -> None:
    assert "undefined" in blns
    assert any(ord(c) > 0xFFFF for s in blns for c in s)  # astral characters are there


@pytest.mark.parametrize("chunk_size", [3, 65536])
def test_blns_as_values(blns: list[str], chunk_size: int) -> None:
    failures = [
        (line, why)
        for line in blns
        if (why := _compare(line, chunk_size=chunk_size)) is not None
        or (why := _compare([line, {"v": line}], chunk_size=chunk_size)) is not None
    ]
    assert not failures, failures[:5]


@pytest.mark.parametrize("option", [0, orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2])
def test_blns_as_keys(blns: list[str], option: int) -> None:
    failures = [
        (line, why)
        for line in blns
        if (why := _compare({line: 1, "other": [line]}, option=option, chunk_size=5)) is not None
    ]
    assert not failures, failures[:5]
    # All of them as keys of one big dict (walked by the encoder, sorted or not).
    big = {line: [i, line] for i, line in enumerate(blns)}
    big["~pad"] = ["x" * 1000] * 100
    assert _compare(big, option=option, chunk_size=1000) is None


def test_blns_long_repeats(blns: list[str]) -> None:
    """Each naughty string repeated past the 64K-character slice: the long-string path."""
    failures = []
    for i, line in enumerate(blns):
        long = line * (70_000 // max(1, len(line)) + 1)
        why = _compare(long, chunk_size=(4096, 65536, 100_000)[i % 3])
        if why is not None:
            failures.append((line, why))
    assert not failures, failures[:5]


def test_blns_all_in_one_document(blns: list[str]) -> None:
    value = {"strings": blns, "joined": "".join(blns) * 20, "by_key": dict.fromkeys(blns, True)}
    assert _compare(value, chunk_size=777) is None
    assert _compare(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) is None
