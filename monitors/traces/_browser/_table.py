"""The episode list of one run, built from its index rows alone (never by parsing the stream):
columns of the fields a list shows, sorted, filtered and binned by reward for a page at a time.

A run's index grows while it writes; ``IndexTable.take`` appends the rows read since the last
look. Sorting and filtering 100,000 rows takes tens of milliseconds of Python, so the work is
cut into steps that give the event loop back after about ``STEP_SECONDS``
(docs/design.md D19); a result is kept for the pages that follow it.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import sys
import time
from array import array
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio
import orjson

__all__ = [
    "BINS",
    "COLUMNS",
    "Clock",
    "IndexTable",
    "Page",
    "Query",
    "QueryError",
    "Where",
]

#: What a list row shows, in this order; ``chunk``/``offset``/``length`` are kept apart.
COLUMNS: Final = (
    "line",
    "step",
    "kind",
    "env",
    "ok",
    "reward",
    "advantage",
    "tokens",
    "input_tokens",
    "output_tokens",
    "turns",
    "errors",
    "duration",
    "bytes",
    "id",
    "group",
)
_STRINGS: Final = frozenset(("kind", "env", "id", "group"))
_SORTABLE: Final = frozenset(COLUMNS) - {"group"}
BINS: Final = 20
#: A step of sorting or filtering gives the loop back after about this long.
STEP_SECONDS: Final = 0.001
_BLOCK: Final = 1024  # rows sorted by one call of ``sorted`` (well under a step)
_ROWS: Final = 128  # index rows parsed by one call of ``orjson.loads`` (~60 KB)
_CACHED: Final = 32  # query results kept


class QueryError(ValueError):
    """A query names a column, value or bound the list does not have."""


@dataclass(frozen=True)
class Where:
    """Where a row's record lives (the index's ``chunk``, ``offset`` and ``length``)."""

    line: int
    chunk: int
    offset: int
    length: int | None


_NAN: Final = math.nan
#: The index row's field each column is read from (prime-rl's ``index_row``, or ours).
_NUMBER_FIELDS: Final = {
    "step": "step",
    "reward": "reward",
    "advantage": "advantage",
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "turns": "turns",
    "errors": "num_errors",
    "duration": "duration",
    "bytes": "length",
}


def _numbers(values: list[Any]) -> list[float]:
    """A number column's values: NaN for none, so no row holds a Python object per value
    and the collector never walks 100,000 rows (orjson never parses an infinity)."""
    return [v if type(v) is float else float(v) if type(v) is int else _NAN for v in values]


def _names(values: list[Any]) -> list[str | None]:
    """A kind or env column: interned, as 100,000 rows share a few names."""
    return [sys.intern(v) if type(v) is str else None for v in values]


def _texts(values: list[Any]) -> list[str | None]:
    return [v if type(v) is str else None for v in values]


def _row_fields(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


_INTS: Final = frozenset(
    ("line", "step", "tokens", "input_tokens", "output_tokens", "turns", "errors", "bytes")
)


def _shown(column: str, value: Any) -> Any:
    """A column's value as the API shows it (None for missing, ints as ints)."""
    if column == "ok":
        return None if value < 0 else bool(value)
    if isinstance(value, float):
        if value != value:
            return None
        return int(value) if column in _INTS else value
    return value


@dataclass(frozen=True)
class Query:
    """One view of the list: its order and filters (the API's query string, checked)."""

    sort: str = "line"
    descending: bool = False
    step: int | None = None
    kind: str | None = None
    env: str | None = None
    errors: bool | None = None
    group: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    tokens_min: float | None = None
    tokens_max: float | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> Query:
        """The query a URL's parameters ask for; ``QueryError`` names a bad one."""
        sort = params.get("sort") or "line"
        descending = sort.startswith("-")
        sort = sort.removeprefix("-")
        if sort not in _SORTABLE:
            raise QueryError(f"sort: no column {sort!r} (one of {', '.join(sorted(_SORTABLE))})")
        errors = params.get("errors") or None
        if errors not in (None, "yes", "no"):
            raise QueryError(f"errors: {errors!r} is not 'yes' or 'no'")
        return cls(
            sort=sort,
            descending=descending,
            step=_param(params, "step", int),
            kind=params.get("kind") or None,
            env=params.get("env") or None,
            errors=None if errors is None else errors == "yes",
            group=params.get("group") or None,
            reward_min=_param(params, "reward_min", float),
            reward_max=_param(params, "reward_max", float),
            tokens_min=_param(params, "tokens_min", float),
            tokens_max=_param(params, "tokens_max", float),
        )


def _param(params: Mapping[str, str], name: str, kind: Callable[[str], Any]) -> Any:
    text = params.get(name)
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        what = "an int" if kind is int else "a number"
        raise QueryError(f"{name}: {text!r} is not {what}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise QueryError(f"{name}: {text!r} is not a finite number")
    return value


def _within(low: float | None, high: float | None, *, closed: bool) -> Callable[[Any], bool]:
    """Values in [low, high] (``closed``) or [low, high); NaN never is."""
    lo = -math.inf if low is None else low
    hi = math.inf if high is None else high
    if closed:
        return lambda value: lo <= value <= hi
    return lambda value: lo <= value < hi


@dataclass(frozen=True)
class Page:
    """One page of a query's rows, with what the list around it shows."""

    total: int
    matched: int
    offset: int
    rows: list[dict[str, Any]]
    edges: list[float]
    counts: list[int]


class _Result:
    """A query's matching positions, in order, and its histogram's counts."""

    def __init__(self, positions: array[int], counts: list[int]) -> None:
        self.positions = positions
        self.counts = counts


class Clock:
    """Gives the loop back once a step has run ``STEP_SECONDS``."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    async def tick(self) -> None:
        if time.perf_counter() - self.start >= STEP_SECONDS:
            await anyio.sleep(0)
            self.start = time.perf_counter()


class IndexTable:
    """The rows of one run's index, as columns, and the queries asked of them."""

    def __init__(self) -> None:
        self.columns: dict[str, Any] = {
            name: [] if name in _STRINGS else array("b") if name == "ok" else array("d")
            for name in COLUMNS
        }
        self.where: dict[int, tuple[int, int, int]] = {}  # line: chunk, offset, length (-1: none)
        self.steps: set[int] = set()
        self.kinds: set[str] = set()
        self.envs: set[str] = set()
        self.reward_low = math.inf
        self.reward_high = -math.inf
        self._orders: dict[tuple[str, bool], tuple[int, array[int]]] = {}
        self._results: OrderedDict[tuple[Query, int], _Result] = OrderedDict()

    def __len__(self) -> int:
        return len(self.columns["line"])

    async def take(self, lines: Iterable[bytes]) -> int:
        """Append the index rows ``lines`` hold (damaged ones are passed over: the stream's
        own tools report them), a block at a time; returns how many were taken."""
        clock = Clock()
        taken = 0
        it = iter(lines)
        while block := list(itertools.islice(it, _ROWS)):
            try:
                parsed = orjson.loads(b"[" + b",".join(block) + b"]")
            except orjson.JSONDecodeError:  # a damaged row: the others are parsed alone
                parsed = [_row_fields(raw) for raw in block]
            taken += self._append([f for f in parsed if type(f) is dict])
            await clock.tick()
        return taken

    def _append(self, rows: list[dict[str, Any]]) -> int:
        where = self.where
        kept = []
        for fields in rows:
            chunk, offset, length = fields.get("chunk"), fields.get("offset"), fields.get("length")
            if type(chunk) is not int or type(offset) is not int:
                continue
            line = fields.get("line")
            if type(line) is not int:
                line = len(where) + 1  # prime-rl's rows have no line: their place is it
            if line in where:
                continue
            where[line] = (chunk, offset, length if type(length) is int else -1)
            fields["line"] = line
            kept.append(fields)
        if not kept:
            return 0
        c = self.columns
        c["line"].extend([float(f["line"]) for f in kept])
        for column, name in _NUMBER_FIELDS.items():
            c[column].extend(_numbers([f.get(name) for f in kept]))
        c["tokens"].extend(
            [
                a + b
                for a, b in zip(
                    c["input_tokens"][-len(kept) :], c["output_tokens"][-len(kept) :], strict=True
                )
            ]
        )
        c["ok"].extend([-1 if type(v) is not bool else int(v) for v in (f.get("ok") for f in kept)])
        c["kind"].extend(_names([f.get("kind") for f in kept]))
        c["env"].extend(_names([f.get("env") for f in kept]))
        c["id"].extend(_texts([f.get("id") for f in kept]))
        c["group"].extend(_texts([f.get("group") for f in kept]))
        new = len(kept)
        self.steps.update(int(v) for v in c["step"][-new:] if v == v)
        self.kinds.update(v for v in c["kind"][-new:] if v is not None)
        self.envs.update(v for v in c["env"][-new:] if v is not None)
        rewards = [v for v in c["reward"][-new:] if v == v]
        if rewards:
            self.reward_low = min(self.reward_low, *rewards)
            self.reward_high = max(self.reward_high, *rewards)
        return new

    def locate(self, line: int) -> Where | None:
        """Where the record of ``line`` lives, if the index has a row for it."""
        found = self.where.get(line)
        if found is None:
            return None
        chunk, offset, length = found
        return Where(line, chunk, offset, None if length < 0 else length)

    def row(self, line: int) -> dict[str, Any] | None:
        """The list row of ``line`` (None: no row)."""
        if line not in self.where:
            return None
        at = bisect.bisect_left(self.columns["line"], line)
        return self._row(at)

    def _row(self, at: int) -> dict[str, Any]:
        return {name: _shown(name, self.columns[name][at]) for name in COLUMNS}

    def edges(self) -> list[float]:
        """The reward histogram's bin edges: the run's whole range (so a filter never moves
        them), in ``BINS`` equal bins."""
        low, high = self.reward_low, self.reward_high
        if low > high:
            return []
        if low == high:
            low, high = low - 0.5, high + 0.5
        width = (high - low) / BINS
        return [low + i * width for i in range(BINS)] + [high]

    async def page(self, query: Query, *, offset: int, limit: int) -> Page:
        """Rows ``offset`` to ``offset + limit`` of what ``query`` selects, in its order."""
        edges = self.edges()
        result = await self._result(query, edges)
        chosen = result.positions[offset : offset + limit]
        return Page(
            total=len(self),
            matched=len(result.positions),
            offset=offset,
            rows=[self._row(at) for at in chosen],
            edges=edges,
            counts=result.counts,
        )

    async def _mask(
        self, tests: list[tuple[str, Callable[[Any], bool]]], *, within: bytes | None = None
    ) -> bytes | None:
        """Which rows pass every test and are in ``within`` (a byte per row), built a column
        at a time; ``within`` itself when there are no tests."""
        if not tests:
            return within
        count = len(self)
        clock = Clock()
        # The rows' bytes ANDed test by test (-1: every bit set).
        passing = -1 if within is None else int.from_bytes(within, "little")
        for name, test in tests:
            column = self.columns[name]
            bits = bytearray()
            for start in range(0, count, _BLOCK):
                bits += bytes(map(test, column[start : start + _BLOCK]))
                await clock.tick()
            passing &= int.from_bytes(bits, "little")
        return passing.to_bytes(count, "little")

    def _tests(self, query: Query) -> list[tuple[str, Callable[[Any], bool]]]:
        """The column tests of ``query``'s filters but the reward range (the histogram
        counts the rows that pass these, so its bins stay put when one is picked)."""
        out: list[tuple[str, Callable[[Any], bool]]] = []
        for name in ("kind", "env", "group"):
            value = getattr(query, name)
            if value is not None:
                out.append((name, value.__eq__))
        if query.step is not None:
            out.append(("step", float(query.step).__eq__))
        if query.errors is not None:
            out.append(("errors", (0.0).__lt__ if query.errors else (0.0).__eq__))
        if query.tokens_min is not None or query.tokens_max is not None:
            out.append(("tokens", _within(query.tokens_min, query.tokens_max, closed=True)))
        return out

    async def _result(self, query: Query, edges: list[float]) -> _Result:
        key = (query, len(self))
        cached = self._results.get(key)
        if cached is not None:
            self._results.move_to_end(key)
            return cached
        order = await self._order(query.sort, query.descending)
        mask = await self._mask(self._tests(query))
        clock = Clock()
        rewards = self.columns["reward"]
        counts = [0] * (BINS if edges else 0)
        if edges:
            low, width = edges[0], (edges[-1] - edges[0]) / BINS
            for start in range(0, len(self), _BLOCK):
                chosen = rewards[start : start + _BLOCK]
                if mask is not None:
                    chosen = itertools.compress(chosen, mask[start : start + _BLOCK])
                # Every reward lies within the edges (the run's range): only the largest
                # falls past the last bin, which is closed.
                for at, n in Counter([int((r - low) / width) for r in chosen if r == r]).items():
                    counts[min(BINS - 1, at)] += n
                await clock.tick()
        if query.reward_min is not None or query.reward_max is not None:
            closed = bool(edges) and query.reward_max == edges[-1]
            in_range = _within(query.reward_min, query.reward_max, closed=closed)
            mask = await self._mask([("reward", in_range)], within=mask)
        if mask is None:
            positions = order
        else:
            positions = array("l")
            for start in range(0, len(order), _BLOCK):
                block = order[start : start + _BLOCK]
                positions.extend(at for at in block if mask[at])
                await clock.tick()
        result = _Result(positions, counts)
        self._results[key] = result
        while len(self._results) > _CACHED:
            self._results.popitem(last=False)
        return result

    async def _order(self, column: str, descending: bool) -> array[int]:
        """Every row's position, sorted by ``column`` (rows without a value last, ties in
        line order), built in steps and kept until rows are added.

        A bucket sort: bounds from a stride sample of the values cut the rows into buckets
        of about ``_BLOCK``, each sorted by one call of ``sorted`` (a step), so no step
        sorts them all and no merge runs in Python.
        """
        count = len(self)
        known = self._orders.get((column, descending))
        if known is not None and known[0] == count:
            return known[1]
        values = self.columns[column]
        clock = Clock()
        if column == "line":
            order = array("l", range(count - 1, -1, -1) if descending else range(count))
            self._orders[(column, descending)] = (count, order)
            return order
        present = array("l")  # arrays, not lists: no Python int per row for the collector
        missing = array("l")
        for start in range(0, count, _BLOCK):
            rows = range(start, min(count, start + _BLOCK))
            real = [v is not None and v == v for v in values[start : start + _BLOCK]]  # NaN: none
            present.extend(itertools.compress(rows, real))
            missing.extend(itertools.compress(rows, map(operator.not_, real)))
            await clock.tick()
        stride = max(1, len(present) // 1024)
        sample = sorted({values[i] for i in present[::stride]})
        every = max(1, len(sample) * _BLOCK // max(1, len(present)))
        bounds = sample[every::every]
        buckets = [array("l") for _ in range(len(bounds) + 1)]
        for start in range(0, len(present), _BLOCK):
            block = present[start : start + _BLOCK]
            keys = map(values.__getitem__, block)
            for i, at in zip(
                block, map(bisect.bisect_right, itertools.repeat(bounds), keys), strict=True
            ):
                buckets[at].append(i)
            await clock.tick()
        order = array("l")
        for bucket in reversed(buckets) if descending else buckets:
            order.extend(sorted(bucket, key=values.__getitem__, reverse=descending))
            await clock.tick()
        order.extend(missing)
        self._orders[(column, descending)] = (count, order)
        return order
