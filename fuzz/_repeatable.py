"""Keep a fuzz run the same from one process (and machine) to the next.

libFuzzer steers by the coverage and the compared values each input produces; anything in
them that changes with the process (an object's address, a random number) sends two runs
from the same seed onto different inputs, so that one may find a crash the other misses.
"""

from __future__ import annotations

import itertools
import types
from pathlib import Path
from typing import Any

from atheris import instrument_bytecode

_NEXT = itertools.count()


def _stable_hash(self: Any) -> int:
    seq: int | None = self.__dict__.get("_repeatable_hash")
    if seq is None:
        seq = self.__dict__["_repeatable_hash"] = next(_NEXT)
    return seq


def number_counters_repeatably() -> None:
    """Call before ``atheris.instrument_imports``.

    Atheris numbers a function's basic blocks in the order it walks a set of its instruction
    objects, which hash by ``id``: the numbering changed with each process's addresses, and
    libFuzzer keeps features in the order of their numbers (ties go by it). A hash from a
    counter, given on first use, walks the set in one order everywhere; instructions still
    compare by identity.
    """
    instrument_bytecode.Instruction.__hash__ = _stable_hash


def uninstrument(function: Any) -> None:
    """Give ``function`` back its code compiled from source, without atheris's counters and
    comparison hooks: for code whose branches follow object addresses."""
    code: types.CodeType = function.__code__
    stack = [compile(Path(code.co_filename).read_text(), code.co_filename, "exec")]
    while stack:
        found = stack.pop()
        if found.co_name == code.co_name and found.co_firstlineno == code.co_firstlineno:
            function.__code__ = found
            return
        stack.extend(c for c in found.co_consts if isinstance(c, types.CodeType))
    raise LookupError(f"no code for {code.co_name} in {code.co_filename}")
