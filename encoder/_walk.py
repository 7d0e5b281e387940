"""The sans-IO core: walk a value one bounded step at a time and yield its JSON in pieces.

Nothing here does I/O or knows about event loops; the drivers in ``sync`` and ``aio`` decide
when to hand control back (docs/design.md D2). Every step does a bounded amount of work: a
group of small values handed to ``orjson.dumps`` whole, one slice of a long string, list or
array, one run of a large dict's keys sorted, or the bracket and key of a large container.
What is "small" is decided by the checks in ``_size`` (docs/design.md D3); what each type
does on entering the walk is chosen from one table, ``_ENTRIES``.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from collections.abc import AsyncIterable, AsyncIterator, Callable, Generator, Iterator
from datetime import date, datetime, time
from functools import partial
from heapq import heappop, heappush, heapreplace
from itertools import islice
from operator import itemgetter
from typing import Any, Final, TypeAlias

import orjson

from ._models import ModelDump, ModelList, RoundedFloats, is_model, record_dump
from ._settings import DEFAULT_LIMITS, Limits, Settings
from ._size import ALONE, ALONE_BIG, BIG, RUN, Segment, Sizer
from .errors import EncodeError, format_path

__all__ = ["AnextRequest", "Piece", "Walker"]

#: orjson calls ``default`` at most 255 times along one path (its results being unsupported
#: again, or holding such values); the walk stops at the same place.
DEFAULT_CHAIN_LIMIT: Final = 255

_dumps = orjson.dumps
_JSONEncodeError = orjson.JSONEncodeError
_NUMERIC: Final = (int, float, bool)
_CONTAINERS: Final = (list, tuple, dict)
_FIRST: Final = (False, 0)  # the path of a one-element list's element
_CACHED_INDENTS: Final = 512
_REGION_BITS: Final = 14  # a region: 2**18 bytes, at most 4,681 containers (56 bytes each)
_first = itemgetter(0)

Piece: TypeAlias = bytes | memoryview
Path: TypeAlias = tuple[bool, object] | None


class AnextRequest:
    """Yielded instead of a piece when the walk needs the next item of an async iterable.

    The async driver awaits ``aiter.__anext__()`` and sends the item back into the walk (or
    ``END`` when the iterable is exhausted); the sync driver never sees one.
    """

    __slots__ = ("aiter",)
    END: Final = object()

    def __init__(self, aiter: AsyncIterator[Any]) -> None:
        self.aiter = aiter


class _Container:
    """A list, tuple, dict, iterator or dataclass being walked element by element.

    Elements are taken a block at a time (the list itself, a dict's items, or what an
    iterator yields). A short block is planned once: each element's size estimated, runs of
    small ones written by one orjson call each, large ones walked on their own. A long block
    is cut into groups whose size adapts to what the previous groups measured.
    """

    __slots__ = (
        "base",
        "block",
        "cap",
        "chain",
        "closer",
        "depth",
        "first",
        "group",
        "i",
        "is_async",
        "is_map",
        "length",
        "numbers",
        "origin",
        "path",
        "plan",
        "prefix",
        "source",
        "take",
        "whole",
    )

    def __init__(
        self,
        *,
        origin: object,
        path: Path,
        depth: int,
        chain: int,
        is_map: bool,
        block: list[Any] | tuple[Any, ...],
        source: Iterator[Any] | AsyncIterator[Any] | None,
        is_async: bool,
        whole: Any,
        groups: bool,
        take: int,
    ) -> None:
        self.origin = origin
        self.path = path
        self.depth = depth
        self.chain = chain  # ``default`` calls on the path to this container
        self.is_map = is_map
        self.source = source
        self.is_async = is_async
        self.take = take  # elements taken from ``source`` in one step
        # A list is its own block; a length change while we walk it is a caller's bug.
        self.whole = whole
        self.length = len(whole) if whole is not None else -1
        self.base = 0  # index of block[0] in the whole sequence
        self.group = 1 if groups else 0  # adaptive group size; 0: one element at a time
        self.cap = 0  # a group may not reach past this index (a larger one was too big)
        # elements in the next slice of numbers (0: not measured yet; -1: a mixed list)
        self.numbers = 0
        self.first = True
        self.closer = b"}" if is_map else b"]"
        self.block = block
        self.i = 0  # next element of the block (adaptive) or next segment (planned)
        self.plan: list[Segment] | None = None
        self.prefix = 0  # a long list's first elements, planned; the rest grouped adaptively


class _Text:
    """A long string (or dict key) written one slice at a time, each slice sized by what the
    previous ones cost to write: escapes and non-ASCII characters write more bytes per
    character than plain text."""

    __slots__ = ("after", "i", "path", "step", "tail", "text")

    def __init__(
        self,
        text: str,
        path: Path,
        step: int,
        *,
        tail: bytes = b'"',
        after: tuple[Any, Path, int, int] | None = None,
    ) -> None:
        self.text = text
        self.path = path
        self.i = 0
        self.step = step  # characters in the next slice
        self.tail = tail  # written after the last slice: the quote (and a key's colon)
        self.after = after  # a key's value, entered once the key is written


class _Array:
    """A large numpy array written along axis 0, a few rows per step."""

    __slots__ = ("array", "depth", "first", "i", "path", "rows")

    def __init__(self, array: Any, path: Path, depth: int, rows: int) -> None:
        self.array = array
        self.path = path
        self.depth = depth
        self.i = 0
        self.first = True
        self.rows = rows


class _Sorting:
    """A large dict's keys sorted a run at a time (``OPT_SORT_KEYS``); once every run is
    sorted, the dict is written from a lazy merge of the runs, in orjson's order.

    A run is a dict, in reverse sorted order, of the keys (and, once a key is met that is
    not a str, the text each becomes). A dict holding only strs and numbers is not tracked by
    the garbage collector, where a list of half a million keys would make the next young
    collection visit every one (15 ms); and the merge takes each run's entries by
    ``popitem``, so they are let go one by one as they are written, not all in its last step.
    The merge's heap is filled with each run's first entry a few hundred runs a step (as
    ``heapq.merge`` would in its first step: 2.5 us a run, 12 ms for five million keys).
    """

    __slots__ = ("chain", "depth", "heap", "keys", "mapping", "path", "primed", "runs", "texts")

    def __init__(self, mapping: dict[Any, Any], path: Path, depth: int, chain: int) -> None:
        self.mapping = mapping
        self.path = path
        self.depth = depth
        self.chain = chain
        self.keys = iter(dict.keys(mapping))
        self.runs: list[dict[Any, Any]] = []  # each run: key -> None, or key -> its text
        self.texts = False
        # the merge: (key, run) or (text, run, key) for each run's smallest entry not written
        self.heap: list[tuple[Any, ...]] = []
        self.primed = 0  # runs whose first entry is in the heap


class _Chain:
    """Containers of one element each, nested (``[[[...]]]``, ``{"a": {"a": ...}}``): one
    frame for the whole run, written ``chain_levels`` levels a step on the way in and on the
    way out. A frame a level would leave one object per level for the garbage collector to
    visit: nesting 100,000 deep then set off full collections of ~100 ms (D7).

    ``containers`` and ``paths`` hold each level entered so far (outermost first); ``value``
    is where the way in goes on (``None`` once its innermost element is entered).
    """

    __slots__ = ("chain", "containers", "depth", "path", "paths", "value")

    def __init__(self, value: Any, path: Path, depth: int, chain: int) -> None:
        self.value: Any = value
        self.path = path  # of ``value``
        self.depth = depth  # of ``value``
        self.chain = chain
        self.containers: list[Any] = []
        self.paths: list[Path] = []


_Frame: TypeAlias = _Container | _Text | _Array | _Sorting | _Chain
#: What entering a value does: ``(walker, value, path, depth, chain, out, big, sizes)``.
_Entry: TypeAlias = Callable[[Any, Any, Path, int, int, list[Piece], bool, Any], None]


class _Unsupported(Exception):
    """Raised by the probe ``default`` when orjson asks what to do with an object."""


def _probe_default(obj: object) -> Any:
    raise _Unsupported


class Walker:
    """One encoding of one value: iterate it to get the JSON as pieces (bytes or memoryview).

    ``allow_async`` lets the walk meet async iterables (it then yields ``AnextRequest``).
    ``limits`` bound each step (tests make them tiny); ``native=False`` uses the pure-Python
    size checks even where the C ones were built.
    """

    def __init__(
        self,
        obj: Any,
        *,
        option: int | None = 0,
        default: Callable[[Any], Any] | None = None,
        iterables: bool = False,
        float_decimals: int | None = None,
        allow_async: bool = False,
        limits: Limits = DEFAULT_LIMITS,
        native: bool = True,
    ) -> None:
        settings = Settings.decode(
            option=option,
            default=default,
            iterables=iterables,
            float_decimals=float_decimals,
            allow_async=allow_async,
            limits=limits,
        )
        self.obj = obj
        self.settings = settings
        self.limits = limits
        self.sizer = Sizer(settings, native=native)
        self.inner = settings.inner
        self.indent = settings.indent
        self.decimals = settings.decimals
        # Where the walk of each model open began (stack lengths): inside one, floats are
        # written as pydantic dumped them (``float_decimals`` reaches only verifiers'
        # per-token floats there).
        self.plain: list[int] = []
        self.wrote_models = False
        self.small = (limits.model_list, limits.model_floats)
        # A string this long is written whole: at most ``str_bytes`` even if every character
        # is escaped (``\u0001``); a longer one, in slices.
        self.str_whole = max(1, limits.str_bytes // 6)
        self.stack: list[_Frame] = []
        # The containers being walked (the cycle check): their ids in one set per region of
        # memory, so that no set grows large. One set of the ids of nesting 100,000 deep
        # took 4-6 ms to grow in one step.
        self.active: dict[int, set[int]] = {}
        self._newlines: list[bytes] = [b"\n"]
        # What entering a value of exactly this type does (``_ENTRIES``), datetimes among the
        # leaves unless passed through to ``default``; any other type goes to ``enter_other``.
        self.entries = _ENTRIES_WITH_DATETIMES if settings.leaves else _ENTRIES

    # -- small helpers ---------------------------------------------------------------------

    def newline(self, depth: int) -> bytes:
        """``\\n`` and the indentation of ``depth`` levels (OPT_INDENT_2)."""
        lines = self._newlines
        if depth > _CACHED_INDENTS:
            return b"\n" + b"  " * depth  # not kept: kept, all of them would grow as depth**2
        while len(lines) <= depth:
            lines.append(b"\n" + b"  " * len(lines))
        return lines[depth]

    def error(self, message: str, *, extra: Path = None) -> EncodeError:
        parts: list[Any] = []
        for f in self.stack:
            if type(f) is _Chain:
                parts.extend(p for p in f.paths if p is not None)
            elif f.path is not None:
                parts.append(f.path)
        if extra is not None:
            parts.append(extra)
        return EncodeError(message, path=format_path(parts))

    def rounded(self, obj: Any) -> Any:
        """``round_floats`` of a small value, or orjson's error when it nests too deep (so the
        walk takes over, as it does when orjson refuses the depth)."""
        try:
            return self.round_floats(obj)
        except RecursionError:
            raise _JSONEncodeError("Recursion limit reached") from None

    def round_floats(self, obj: Any) -> Any:
        """A copy of a small plain value with every float rounded (``float_decimals``)."""
        n = self.decimals
        t = type(obj)
        if t is float:
            return round(obj, n)
        if t is list or t is tuple:
            return [self.round_floats(v) for v in obj]
        if t is dict:
            return {k: self.round_floats(v) for k, v in obj.items()}
        return obj

    def dump_group(self, value: Any, depth: int) -> Piece:
        """orjson's bytes for a small list or dict, without its brackets, indented for
        ``depth``; raises ``orjson.JSONEncodeError`` as orjson does."""
        if self.decimals is not None:
            value = self.rounded(value)
        out = _dumps(value, option=self.inner, default=_probe_default)
        if not self.indent:
            return memoryview(out)[1:-1]
        if depth:
            return out[1:-2].replace(b"\n", self.newline(depth))
        return memoryview(out)[1:-2]

    def dump_whole(self, value: Any, depth: int) -> bytes:
        """orjson's bytes for a small value in place, indented for ``depth``."""
        if self.decimals is not None:
            value = self.rounded(value)
        out = _dumps(value, option=self.inner, default=_probe_default)
        if self.indent and depth:
            return out.replace(b"\n", self.newline(depth))
        return out

    def dump_leaf(self, obj: Any, path: Path, depth: int = 0, *, probe: bool = False) -> bytes:
        """orjson's bytes for one leaf; ``_Unsupported`` when ``probe`` and orjson would call
        ``default`` for it."""
        decimals = self.decimals
        try:
            if probe:
                out = _dumps(obj, option=self.inner, default=_probe_default)
            elif decimals is not None and type(obj) is float:
                out = _dumps(round(obj, decimals), option=self.inner)
            elif decimals is not None and _is_numpy_float(obj):
                out = _dumps(_round_numpy(obj, decimals), option=self.inner)
            else:
                out = _dumps(obj, option=self.inner)
        except _JSONEncodeError as exc:
            if isinstance(exc.__cause__, _Unsupported):
                raise _Unsupported from None
            raise self.error(str(exc), extra=path) from None
        if self.indent and depth and b"\n" in out and not isinstance(obj, orjson.Fragment):
            return out.replace(b"\n", self.newline(depth))
        return out

    def key_bytes(self, key: Any) -> bytes:
        """A dict key as orjson writes it (quoted, before the colon)."""
        if type(key) is str:
            try:
                return _dumps(key)
            except _JSONEncodeError as exc:
                raise self.error(str(exc), extra=(True, key)) from None
        if not self.settings.non_str_keys:
            raise self.error("Dict key must be str", extra=(True, key))
        try:
            return _dumps({key: None}, option=self.settings.key_option)[1:-6]
        except _JSONEncodeError as exc:
            raise self.error(str(exc), extra=(True, key)) from None

    def key_texts(self, keys: list[Any]) -> list[str]:
        """The text each key becomes, which orjson sorts by (not the quoted, escaped form):
        one orjson call for them all unless two keys become the same text."""
        try:
            texts = list(orjson.loads(_dumps(dict.fromkeys(keys), option=self.settings.key_option)))
        except _JSONEncodeError:
            texts = []
        if len(texts) != len(keys):
            texts = [orjson.loads(self.key_bytes(k)) for k in keys]
        return texts

    def sorted_items(self, items: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        """A short list of dict items in orjson's sorted order."""
        keys = [k for k, _ in items]
        if all(type(k) is str for k in keys):
            self.check_keys(keys)
            items.sort(key=_first)
            return items
        keyed = sorted(zip(self.key_texts(keys), items, strict=True), key=_first)
        return [item for _, item in keyed]

    def check_keys(self, keys: list[str]) -> None:
        """Raise for the first str key orjson cannot write: sorting, orjson reads every key
        before any value, so a bad key is the error even where a value before it is bad."""
        try:
            _dumps(keys)
        except _JSONEncodeError:
            for key in keys:
                self.key_bytes(key)

    def unsupported(self, obj: Any) -> str:
        """orjson's message for an object it cannot write (when ``default`` fails on it)."""
        try:
            _dumps(obj, option=self.inner, default=_probe_default)
        except _JSONEncodeError as exc:
            return str(exc)
        return f"Type is not JSON serializable: {type(obj).__name__}"

    # -- the walk ----------------------------------------------------------------------------

    def __iter__(self) -> Generator[Piece | AnextRequest, Any, None]:
        return self.walk()

    def walk(self) -> Generator[Piece | AnextRequest, Any, None]:
        """Yield the JSON of the value in pieces, one bounded step at a time.

        A step that writes nothing yields ``b""``, so a driver can look at its clock.
        """
        stack = self.stack
        plain = self.plain
        steps = _STEPS
        out: list[Piece] = []
        self.enter(self.obj, None, 0, 0, out)
        yield from out
        while stack:
            out.clear()
            frame = stack[-1]
            request = steps[type(frame)](self, frame, out)
            while plain and len(stack) <= plain[-1]:  # a model's walk is done
                plain.pop()
                if not plain:
                    self.decimals = self.settings.decimals
            if request is not None:
                assert type(frame) is _Container
                self.received(frame, (yield request))
            if out:
                yield from out
            else:
                yield b""
        if self.settings.newline:
            yield b"\n"

    def enter(
        self,
        obj: Any,
        path: Path,
        depth: int,
        chain: int,
        out: list[Piece],
        *,
        big: bool = False,
        sizes: tuple[int, ...] | None = None,
    ) -> None:
        """Write ``obj`` whole if it is small, else push a frame that walks it.

        ``chain`` counts the ``default`` calls on its path. ``big`` says the caller already
        found it too large to write whole; ``sizes`` are its elements' estimates, as far as
        that plan measured them (see ``Segment``).
        """
        entry: _Entry = self.entries.get(type(obj), Walker.enter_other)
        entry(self, obj, path, depth, chain, out, big, sizes)

    def enter_leaf(
        self, obj: Any, path: Path, depth: int, chain: int, out: list[Piece], *_: object
    ) -> None:
        out.append(self.dump_leaf(obj, path))

    def enter_str(
        self, obj: str, path: Path, depth: int, chain: int, out: list[Piece], *_: object
    ) -> None:
        if len(obj) <= self.str_whole:
            out.append(self.dump_leaf(obj, path))
            return
        self.stack.append(_Text(obj, path, self.str_whole))
        out.append(b'"')

    def enter_sequence(
        self,
        obj: list[Any] | tuple[Any, ...],
        path: Path,
        depth: int,
        chain: int,
        out: list[Piece],
        big: bool,
        sizes: tuple[int, ...] | None,
    ) -> None:
        if not obj:
            out.append(b"[]")
            return
        limit = self.limits.group_bytes
        if type(obj[0]) in _NUMERIC:
            # Numbers (token ids, masks, logprobs): proven so by one pass in C, whole if they
            # fit (a caller's "big" may only mean it did not look). A list too long to fit
            # even at 8 bytes a number is not read here.
            fits = len(obj) * 8 <= limit and self.sizer.numbers(obj) <= limit
        else:
            fits = not big and self.sizer.size([obj]) <= limit
        if fits:
            try:
                out.append(self.dump_whole(obj, depth))
                return
            except _JSONEncodeError:
                pass  # too deep for orjson, or a bad leaf: walk it to find which
        if len(obj) == 1 and self.links(obj):
            self.enter_chain(obj, path, depth, chain, out)
            return
        self.push(obj, path, depth, chain, is_map=False, block=obj, whole=obj, sizes=sizes)
        out.append(b"[")

    def enter_dict(
        self,
        obj: dict[Any, Any],
        path: Path,
        depth: int,
        chain: int,
        out: list[Piece],
        big: bool,
        sizes: tuple[int, ...] | None,
    ) -> None:
        n = len(obj)
        if not big and n <= self.limits.plan_elements:
            # A record-like dict: plan it from its values (a long list of numbers among them
            # is then proven numeric in one pass); whole if the plan is one run.
            block = list(dict.items(obj))
            plan = self.sizer.plan(block, True)
            if len(plan) <= 1 and (not plan or plan[0][2] == RUN):
                try:
                    out.append(self.dump_whole(obj, depth))  # orjson sorts it if asked
                    return
                except _JSONEncodeError:
                    plan = [(j, j + 1, ALONE) for j in range(len(block))]
            if n == 1 and self.links(obj):
                self.enter_chain(obj, path, depth, chain, out)
                return
            if self.settings.sort:
                block = self.sorted_items(block)
                if any(segment[2] != ALONE for segment in plan):  # else: one by one anyway
                    plan = self.sizer.plan(block, True)
            self.push(obj, path, depth, chain, is_map=True, block=block, whole=obj, plan=plan)
            out.append(b"{")
            return
        if not big and self.sizer.size([obj]) <= self.limits.group_bytes:
            try:
                out.append(self.dump_whole(obj, depth))
                return
            except _JSONEncodeError:
                pass
        if n == 1 and self.links(obj):
            self.enter_chain(obj, path, depth, chain, out)
            return
        self.enter_map(obj, path, depth, chain, out, sizes=sizes)

    def enter_map(
        self,
        obj: dict[Any, Any],
        path: Path,
        depth: int,
        chain: int,
        out: list[Piece],
        *,
        sizes: tuple[int, ...] | None = None,
    ) -> None:
        """Walk a dict (or a dict subclass, by its own items) key by key."""
        limits = self.limits
        n = dict.__len__(obj)
        if self.settings.sort:
            if n > limits.sort_run:
                self.enter_container(obj, path)
                self.stack.append(_Sorting(obj, path, depth, chain))
            else:
                block = self.sorted_items(list(dict.items(obj)))
                self.push(obj, path, depth, chain, is_map=True, block=block, whole=obj)
        elif n <= limits.plan_elements:
            block = list(dict.items(obj))
            self.push(obj, path, depth, chain, is_map=True, block=block, whole=obj, sizes=sizes)
        else:
            items = iter(dict.items(obj))
            self.push(obj, path, depth, chain, is_map=True, block=[], source=items, whole=obj)
        out.append(b"{")

    def links(self, obj: Any) -> bool:
        """Whether ``obj``, a list, tuple or dict of one element, is a level of a chain: its
        element a list, tuple or dict (and its key, if any, short enough to write whole)."""
        if type(obj) is not dict:
            return type(obj[0]) in _CONTAINERS
        for key, value in dict.items(obj):
            return type(value) in _CONTAINERS and (
                type(key) is not str or len(key) <= self.str_whole
            )
        return False

    def enter_chain(self, obj: Any, path: Path, depth: int, chain: int, out: list[Piece]) -> None:
        """Walk nested one-element containers with one frame for them all (``_Chain``)."""
        frame = _Chain(obj, path, depth, chain)
        self.stack.append(frame)
        self.chain_in(frame, out)

    def chain_in(self, frame: _Chain, out: list[Piece]) -> None:
        """Open up to ``chain_levels`` levels; the innermost element is entered as any value."""
        value, path, depth = frame.value, frame.path, frame.depth
        containers, paths = frame.containers, frame.paths
        indent = self.indent
        colon = b": " if indent else b":"
        parts: list[bytes] = []
        try:
            for _ in range(self.limits.chain_levels):
                self.enter_container(value, path)
                containers.append(value)
                paths.append(path)
                if type(value) is dict:
                    ((key, value),) = dict.items(value)
                    parts.append(b"{")
                    if indent:
                        parts.append(self.newline(depth + 1))
                    parts.append(self.key_bytes(key))
                    parts.append(colon)
                    path = (True, key)
                else:
                    value = value[0]
                    parts.append(b"[")
                    if indent:
                        parts.append(self.newline(depth + 1))
                    path = _FIRST
                depth += 1
                if not (type(value) in _CONTAINERS and len(value) == 1 and self.links(value)):
                    frame.value, frame.depth = None, depth
                    out.append(b"".join(parts))
                    parts.clear()
                    self.enter(value, path, depth, frame.chain, out)
                    return
        finally:
            if parts:
                out.append(b"".join(parts))
        frame.value, frame.path, frame.depth = value, path, depth

    def chain_out(self, frame: _Chain, out: list[Piece]) -> None:
        """Close up to ``chain_levels`` levels, innermost first."""
        containers, paths = frame.containers, frame.paths
        depth = frame.depth
        parts: list[bytes] = []
        for _ in range(min(len(containers), self.limits.chain_levels)):
            level = containers[-1]
            is_map = type(level) is dict
            if len(level) != 1:
                out.append(b"".join(parts))
                kind = "dict" if is_map else "list"
                raise self.error(f"{kind} changed size during encoding")
            containers.pop()
            paths.pop()
            self.leave_container(level)
            depth -= 1
            if self.indent:
                parts.append(self.newline(depth))
            parts.append(b"}" if is_map else b"]")
        frame.depth = depth
        out.append(b"".join(parts))
        if not containers:
            self.stack.pop()

    def step_chain(self, frame: _Chain, out: list[Piece]) -> None:
        if frame.value is not None:
            self.chain_in(frame, out)
        else:
            self.chain_out(frame, out)

    def enter_other(
        self, obj: Any, path: Path, depth: int, chain: int, out: list[Piece], *_: object
    ) -> None:
        """Anything but exact JSON types: subclasses, dataclasses, enums, numpy arrays,
        iterables, and what only ``default`` knows how to write."""
        settings = self.settings
        if settings.subclasses and isinstance(obj, dict):
            self.enter_map(obj, path, depth, chain, out)
        elif settings.subclasses and isinstance(obj, list):
            # The items themselves, as orjson takes them (not an overridden __getitem__).
            block = list.copy(obj)
            self.push(obj, path, depth, chain, is_map=False, block=block, whole=obj)
            out.append(b"[")
        elif settings.subclasses and isinstance(obj, str):
            # The characters themselves, as orjson takes them (not an overridden __str__).
            self.enter_str(str.__str__(obj), path, depth, chain, out)
        elif settings.dataclasses and "__dataclass_fields__" in type(obj).__dict__:
            # orjson's test: the class itself was made by @dataclass (a plain subclass of one
            # is not a dataclass to it). Field by field: orjson never sorts a dataclass's
            # keys, so no group of them may go through one orjson call with OPT_SORT_KEYS.
            fields = self.dataclass_items(obj, path)
            if self.decimals is None and self.sizer.size([v for _, v in fields]) <= (
                self.limits.group_bytes
            ):
                try:  # small: orjson writes it, as it writes any dataclass
                    out.append(self.dump_whole(obj, depth))
                    return
                except _JSONEncodeError:
                    pass
            self.push(obj, path, depth, chain, is_map=True, block=fields, groups=False)
            out.append(b"{")
        elif is_model(obj):
            view = record_dump(obj, self.settings.decimals) or ModelDump(obj)
            self.enter_model(view, path, depth, chain, out)
        elif isinstance(obj, enum.Enum):
            self.enter(obj.value, path, depth, chain, out)
        elif settings.numpy and _is_ndarray(obj) and self.array_walkable(obj):
            if obj.size * 20 <= self.limits.group_bytes or len(obj) == 0:
                out.append(self.dump_leaf(obj, path, depth))
            else:
                self.enter_container(obj, path)
                per_row = max(1, obj.size // len(obj))
                rows = max(1, self.limits.number_bytes // 20 // per_row)
                self.stack.append(_Array(obj, path, depth, rows))
                out.append(b"[")
        elif settings.iterables and isinstance(obj, Iterator):
            self.push(obj, path, depth, chain, is_map=False, block=[], source=obj)
            out.append(b"[")
        elif settings.iterables and isinstance(obj, AsyncIterable):
            if not settings.allow_async:
                raise self.error(
                    "an async iterable can only be encoded by aiterencode or adump", extra=path
                )
            source = obj.__aiter__()
            self.push(obj, path, depth, chain, is_map=False, block=[], source=source, is_async=True)
            out.append(b"[")
        else:
            self.enter_default(obj, path, depth, chain, out)

    def enter_model(
        self, view: ModelDump, path: Path, depth: int, chain: int, out: list[Piece], *_: object
    ) -> None:
        """A pydantic model: pydantic's dump of its light fields, written as a dict is (whole
        if small), its lists of sub-models and per-token floats walked on their own."""
        try:
            items, parted = view.items(self.small)
        except Exception as exc:
            name = type(view.model).__name__
            raise self.error(f"{name}.model_dump failed: {exc}", extra=path) from exc
        self.wrote_models = True
        start = len(self.stack)
        if parted is None:  # not a dict: written as any value, and rounded no further
            decimals, self.decimals = self.decimals, None
            self.enter(items, path, depth, chain, out)
            if len(self.stack) > start:
                self.plain.append(start)  # walked on: no rounding until it is done
            else:
                self.decimals = decimals
            return
        if not parted:
            if self.decimals is None:
                self.enter(items, path, depth, chain, out)  # pydantic's dict, as any dict
                return
            items = list(items.items())
        if self.settings.sort:
            items = self.sorted_items(items)
        self.push(view, path, depth, chain, is_map=True, block=items)
        self.plain.append(start)
        self.decimals = None
        out.append(b"{")

    def enter_models(
        self, models: ModelList, path: Path, depth: int, chain: int, out: list[Piece], *_: object
    ) -> None:
        """A list of sub-models, a few at a time (each a ``ModelDump`` only while its
        group is being written)."""
        take = self.limits.plan_elements
        whole = models.models
        self.push(
            models,
            path,
            depth,
            chain,
            is_map=False,
            block=[],
            source=models.views(),
            whole=whole,
            take=take,
        )
        out.append(b"[")

    def enter_rounded(
        self,
        floats: RoundedFloats,
        path: Path,
        depth: int,
        chain: int,
        out: list[Piece],
        *_: object,
    ) -> None:
        """verifiers' per-token floats, rounded in C a slice at a time."""
        if self.sizer.numbers(floats.values) == BIG:
            raise self.error(
                "a per-token float list holds something that is not a number", extra=path
            )
        limits = self.limits
        if len(floats) * 20 <= min(limits.group_bytes, limits.number_bytes):
            out.append(self.dump_whole(floats[:], depth))
            return
        self.push(floats, path, depth, chain, is_map=False, block=floats, whole=floats)  # type: ignore[arg-type]
        out.append(b"[")

    def enter_default(self, obj: Any, path: Path, depth: int, chain: int, out: list[Piece]) -> None:
        """A value orjson writes by itself (a UUID, a Fragment, ...), else ``default``'s
        answer for it, walked in its place."""
        default = self.settings.default
        try:
            out.append(self.dump_leaf(obj, path, depth, probe=default is not None))
            return
        except _Unsupported:
            pass
        if chain >= DEFAULT_CHAIN_LIMIT:
            raise self.error("default serializer exceeds recursion limit", extra=path)
        try:
            value = default(obj)  # type: ignore[misc]
        except Exception as exc:
            raise self.error(self.unsupported(obj), extra=path) from exc
        self.enter(value, path, depth, chain + 1, out)

    def dataclass_items(self, obj: Any, path: Path) -> list[tuple[str, Any]]:
        """A dataclass's fields as orjson writes them, never sorted, private (``_``) names
        left out: the instance's ``__dict__``, unless it has none or its class declares
        ``__slots__``, then the declared fields."""
        attrs = getattr(obj, "__dict__", None)
        if attrs is None or "__slots__" in type(obj).__dict__:
            names = [f.name for f in dataclasses.fields(obj)]
            return [(n, getattr(obj, n)) for n in names if not n.startswith("_")]
        for key in attrs:
            if type(key) is not str:
                raise self.error("Dict key must be str", extra=path)
        return [(k, v) for k, v in attrs.items() if not k.startswith("_")]

    def array_walkable(self, array: Any) -> bool:
        """Whether orjson writes this ndarray itself (so slices of it write the same bytes)."""
        if array.ndim == 0 or not array.flags.c_contiguous:
            return False
        try:
            _dumps(array.reshape(-1)[:1], option=self.inner)
        except _JSONEncodeError:
            return False
        return True

    def enter_container(self, obj: object, path: Path) -> None:
        key = id(obj) >> 4  # objects are 16-byte aligned: the low bits say nothing
        region = key >> _REGION_BITS
        ids = self.active.get(region)
        if ids is None:
            self.active[region] = ids = set()
        elif key in ids:
            raise self.error("Circular reference detected", extra=path)
        ids.add(key)

    def leave_container(self, obj: object) -> None:
        key = id(obj) >> 4
        self.active[key >> _REGION_BITS].discard(key)

    def push(
        self,
        obj: Any,
        path: Path,
        depth: int,
        chain: int,
        *,
        is_map: bool,
        block: list[Any] | tuple[Any, ...],
        whole: Any = None,
        source: Iterator[Any] | AsyncIterator[Any] | None = None,
        is_async: bool = False,
        groups: bool = True,
        plan: list[Segment] | None = None,
        sizes: tuple[int, ...] | None = None,
        take: int = 0,
    ) -> None:
        self.enter_container(obj, path)
        limits = self.limits
        frame = _Container(
            origin=obj,
            path=path,
            depth=depth,
            chain=chain,
            is_map=is_map,
            block=block,
            source=source,
            is_async=is_async,
            whole=whole,
            groups=groups,
            take=take or limits.max_group,
        )
        if plan is not None:
            frame.plan = plan
        elif block and groups and len(block) <= limits.plan_elements:
            frame.plan = self.sizer.plan(block, is_map, sizes)
        elif groups and sizes is not None and not is_map and len(sizes) < len(block):
            # A long list whose first elements were measured by the plan that found it large:
            # they are planned from those sizes, not read again; the rest is grouped after.
            frame.prefix = len(sizes)
            frame.plan = self.sizer.plan(block[: frame.prefix], False, sizes)
            known = [size for size in sizes if 0 < size <= limits.group_bytes]
            if known:
                frame.group = max(
                    1, min(limits.max_group, len(known) * (limits.group_bytes // 2) // sum(known))
                )
        self.stack.append(frame)

    def pop(self, frame: _Frame) -> None:
        self.stack.pop()
        if type(frame) is _Container:
            self.leave_container(frame.origin)
        elif type(frame) is _Array:
            self.leave_container(frame.array)

    # -- the steps of each kind of frame -------------------------------------------------------

    def step_text(self, frame: _Text, out: list[Piece]) -> None:
        text, i, n = frame.text, frame.i, frame.step
        if i >= len(text):
            self.pop(frame)
            out.append(frame.tail)
            if frame.after is not None:
                value, path, depth, chain = frame.after
                self.enter(value, path, depth, chain, out)
            return
        part = text[i : i + n]
        frame.i = i + n
        try:
            data = _dumps(part)
        except _JSONEncodeError as exc:
            raise self.error(str(exc)) from None
        # The next slice aims at ``str_bytes`` of output, at the rate this one wrote.
        target = self.limits.str_bytes
        frame.step = max(1, min(target, n * target // max(len(data), 1)))
        out.append(memoryview(data)[1:-1])

    def step_array(self, frame: _Array, out: list[Piece]) -> None:
        array, i, depth = frame.array, frame.i, frame.depth
        n = len(array)
        if i >= n:
            self.pop(frame)
            out.append(self.newline(depth) + b"]" if self.indent else b"]")
            return
        if not frame.first:
            out.append(b",")
        frame.first = False
        if frame.rows == 1 and array.ndim > 1 and array[i].size * 20 > self.limits.number_bytes:
            # A large row, written as an array of its own (a single element would be a numpy
            # scalar, which orjson may refuse where it writes the array: longlong).
            frame.i = i + 1
            if self.indent:
                out.append(self.newline(depth + 1))
            self.enter(array[i], (False, i), depth + 1, 0, out)
            return
        frame.i = i + frame.rows
        part = array[i : i + frame.rows]
        if self.decimals is not None and part.dtype.kind == "f":
            part = _round_numpy(part, self.decimals)
        try:
            out.append(self.dump_group(part, depth))
        except _JSONEncodeError as exc:
            raise self.error(str(exc), extra=(False, i)) from None

    def step_sorting(self, frame: _Sorting, out: list[Piece]) -> None:
        """Sort the next run of a large dict's keys; after the last, write the dict from a
        lazy merge of the runs (ties keep the dict's order, as a stable sort does)."""
        try:
            keys = list(islice(frame.keys, self.limits.sort_run))
        except RuntimeError:
            raise self.error("dict changed size during encoding") from None
        if keys:
            if not frame.texts and all(type(k) is str for k in keys):
                self.check_keys(keys)
                keys.sort(reverse=True)
                frame.runs.append(dict.fromkeys(keys))
                return
            if not frame.texts:  # the first key that is no str: texts from now on
                frame.texts = True
                frame.runs = [{k: k for k in run} for run in frame.runs]
            texts = self.key_texts(keys)
            # Ascending by text, ties in the dict's order; stored the other way round.
            order = sorted(range(len(keys)), key=texts.__getitem__)
            frame.runs.append({keys[j]: texts[j] for j in reversed(order)})
            return
        runs, heap = frame.runs, frame.heap
        if frame.primed < len(runs):
            end = min(len(runs), frame.primed + max(1, self.limits.sort_run // 4))
            for i in range(frame.primed, end):
                key, text = runs[i].popitem()
                heappush(heap, (text, i, key) if frame.texts else (key, i))
            frame.primed = end
            return
        self.stack.pop()
        self.leave_container(frame.mapping)
        merged = _merge_texts(heap, runs) if frame.texts else _merge_keys(heap, runs)
        mapping = frame.mapping
        items = map(partial(_item, mapping), merged)
        self.push(
            mapping,
            frame.path,
            frame.depth,
            frame.chain,
            is_map=True,
            block=[],
            source=items,
            whole=mapping,
            take=max(1, self.limits.sort_run // 8),  # ~2 us an item through the merge
        )

    def step_container(self, frame: _Container, out: list[Piece]) -> AnextRequest | None:
        """One step of a container: a group of small elements, or one large element.

        Returns a request when the next element must come from an async iterable.
        """
        whole = frame.whole
        if whole is not None and len(whole) != frame.length:
            kind = "dict" if frame.is_map else "list"
            raise self.error(f"{kind} changed size during encoding")
        block = frame.block
        plan = frame.plan
        if plan is not None and frame.prefix and frame.i >= len(plan):
            # A long list's planned first elements are written: the rest, grouped adaptively.
            frame.plan = plan = None
            frame.i, frame.prefix = frame.prefix, 0
        if plan is not None:
            if frame.i < len(plan):
                self.step_planned(frame, plan, out)
                return None
        elif frame.i < len(block):
            self.step_adaptive(frame, out)
            return None
        # This block is done: the next one, or the end.
        if frame.source is None:
            self.close(frame, out)
            return None
        if frame.is_async:
            return AnextRequest(frame.source)  # type: ignore[arg-type]
        try:
            nxt = list(islice(frame.source, frame.take))  # type: ignore[arg-type]
        except RuntimeError as exc:
            raise self.error(str(exc)) from None
        except KeyError:  # a sorted key gone from its dict
            raise self.error("dict changed during encoding") from None
        self.next_block(frame, nxt)
        if not nxt:
            self.close(frame, out)
        return None

    def received(self, frame: _Container, item: Any) -> None:
        """The async driver's answer to an ``AnextRequest``."""
        self.next_block(frame, [] if item is AnextRequest.END else [item])

    def next_block(self, frame: _Container, block: list[Any]) -> None:
        frame.base += len(frame.block)
        frame.block, frame.i, frame.cap = block, 0, 0
        if not block:
            frame.source = None
        frame.plan = (
            self.sizer.plan(block, frame.is_map)
            if block and frame.group and len(block) <= self.limits.plan_elements
            else None
        )

    def step_planned(self, frame: _Container, plan: list[Segment], out: list[Piece]) -> None:
        segment = plan[frame.i]
        start, end, kind = segment[0], segment[1], segment[2]
        frame.i += 1
        block = frame.block
        if kind == RUN:
            part = block[start:end]
            group: Any = dict(part) if frame.is_map else part
            try:
                if len(group) != len(part):
                    raise _JSONEncodeError("keys equal as Python values (1 and 1.0)")
                piece = self.dump_group(group, frame.depth)
            except _JSONEncodeError:
                # A bad value (or nesting orjson refuses) in the run: walk it one by one.
                plan[frame.i - 1 : frame.i] = [(j, j + 1, ALONE) for j in range(start, end)]
                frame.i -= 1
                return
            if not frame.first:
                out.append(b",")
            frame.first = False
            out.append(piece)
            return
        sizes = segment[3] if len(segment) > 3 else None
        self.element(frame, start, out, big=kind == ALONE_BIG, sizes=sizes)

    def element(
        self,
        frame: _Container,
        i: int,
        out: list[Piece],
        *,
        big: bool,
        sizes: tuple[int, ...] | None = None,
    ) -> None:
        """Write one element of the block on its own (it is large, or not plain JSON)."""
        if not frame.first:
            out.append(b",")
        frame.first = False
        depth = frame.depth
        if self.indent:
            out.append(self.newline(depth + 1))
        if not frame.is_map:
            path = (False, frame.base + i)
            self.enter(frame.block[i], path, depth + 1, frame.chain, out, big=big, sizes=sizes)
            return
        key, value = frame.block[i]
        path = (True, key)
        colon = b": " if self.indent else b":"
        if type(key) is str and len(key) > self.str_whole:
            # A long key is written in slices too; its value follows.
            after = (value, path, depth + 1, frame.chain)
            self.stack.append(_Text(key, path, self.str_whole, tail=b'"' + colon, after=after))
            out.append(b'"')
            return
        out.append(self.key_bytes(key))
        out.append(colon)
        self.enter(value, path, depth + 1, frame.chain, out, big=big, sizes=sizes)

    def step_adaptive(self, frame: _Container, out: list[Piece]) -> None:
        i = frame.i
        if frame.group:
            piece = self.try_group(frame, frame.block, i, frame.group)
            if piece is not None:
                if not frame.first:
                    out.append(b",")
                frame.first = False
                out.append(piece)
                return
            if frame.group > 1:
                return  # the group shrank: try again with fewer elements
        frame.i = i + 1
        self.element(frame, i, out, big=frame.group == 1)

    def try_numbers(self, frame: _Container, block: Any, i: int) -> Piece | None:
        """Write the next slice of a long run of numbers in one orjson call, if it is one."""
        limit = self.limits.number_bytes
        n = frame.numbers or max(1, limit // 20)  # at first, as if every number were a float
        part = block if i == 0 and len(block) <= n else block[i : i + n]
        size = self.sizer.numbers(part)
        if size == BIG:
            frame.numbers = -1  # a mixed list: grouped as any other from now on
            return None
        try:
            piece = self.dump_group(part, frame.depth)
        except _JSONEncodeError:
            frame.numbers = -1  # a number orjson refuses: found by the groups
            return None
        frame.i = i + len(part)
        # The next slice aims at ``number_bytes`` estimated (floats cost more than ints).
        frame.numbers = max(1, len(part) * limit // max(size, 1))
        return piece

    def try_group(self, frame: _Container, block: Any, i: int, g: int) -> Piece | None:
        """Write ``g`` or so elements from ``block[i]`` in one orjson call, if they are small.

        Returns None (and shrinks ``frame.group``) when they are not.
        """
        limits = self.limits
        if not frame.is_map and frame.numbers >= 0 and type(block[i]) in _NUMERIC:
            piece = self.try_numbers(frame, block, i)
            if piece is not None:
                return piece
        if frame.cap > i:
            g = min(g, frame.cap - i)
        value = block[i][1] if frame.is_map else block[i]
        t = type(value)
        if t not in self.settings.plain:
            # Not plain JSON (a dataclass, a subclass, ...): exploring it would wander into
            # its class; it is walked on its own.
            frame.group = 1
            return None
        if g == 1 and (t is list or t is tuple) and len(value) > 64 and type(value[0]) in _NUMERIC:
            # A list of numbers alone: ``enter`` proves it so more cheaply. (The group may
            # be larger than g, cut to 1 by ``cap``: it must shrink, or this step repeats.)
            frame.group = 1
            return None
        part = block[i : i + g]
        group: Any = dict(part) if frame.is_map else part
        if frame.is_map and len(group) != len(part):
            frame.group = 1  # keys equal as Python values (1 and 1.0): write one at a time
            return None
        limit = limits.group_bytes
        size = self.sizer.size([group])
        if size > limit:
            # Something in block[i:i+g] is large: no group may reach past it until it is found.
            frame.cap = i + g
            frame.group = 1 if size == BIG or g == 1 else max(1, g * limit // size // 4)
            return None
        try:
            piece = self.dump_group(group, frame.depth)
        except _JSONEncodeError:
            frame.group = 1
            frame.cap = i + g
            return None
        frame.i = i + len(part)
        # Aim at half the limit, so that the next group rarely overshoots and is explored
        # twice; by what was written where that is more than estimated (escaped text).
        cost = max(size, len(piece))
        frame.group = min(limits.max_group, g * 4, max(1, g * (limit // 2) // max(cost, 1)))
        return piece

    def close(self, frame: _Container, out: list[Piece]) -> None:
        self.pop(frame)
        if frame.first or not self.indent:
            out.append(frame.closer)
        else:
            out.append(self.newline(frame.depth) + frame.closer)


# The tables hold plain functions, not methods bound to a walker: a walker holding its own
# bound methods would be a reference cycle, garbage only a collection frees (D7).
_ENTRIES: Final[dict[Any, _Entry]] = {
    str: Walker.enter_str,
    list: Walker.enter_sequence,
    tuple: Walker.enter_sequence,
    dict: Walker.enter_dict,
    int: Walker.enter_leaf,
    float: Walker.enter_leaf,
    bool: Walker.enter_leaf,
    type(None): Walker.enter_leaf,
    ModelDump: Walker.enter_model,
    ModelList: Walker.enter_models,
    RoundedFloats: Walker.enter_rounded,
}
_ENTRIES_WITH_DATETIMES: Final = _ENTRIES | dict.fromkeys((datetime, date, time), Walker.enter_leaf)
_STEPS: Final[dict[type, Callable[[Walker, Any, list[Piece]], AnextRequest | None]]] = {
    _Container: Walker.step_container,
    _Text: Walker.step_text,
    _Array: Walker.step_array,
    _Sorting: Walker.step_sorting,
    _Chain: Walker.step_chain,
}


def _merge_keys(heap: list[tuple[Any, ...]], runs: list[dict[Any, Any]]) -> Iterator[Any]:
    """The keys of sorted runs, smallest first, from a heap holding each run's smallest
    (``(key, run)``); each entry is let go as it is taken. Ties cannot happen: keys differ."""
    while heap:
        key, i = heap[0]
        run = runs[i]
        if run:
            heapreplace(heap, (run.popitem()[0], i))
        else:
            heappop(heap)
        yield key


def _merge_texts(heap: list[tuple[Any, ...]], runs: list[dict[Any, str]]) -> Iterator[Any]:
    """The keys of sorted runs in the order of their texts, from a heap holding each run's
    smallest (``(text, run, key)``): keys of the same text in the dict's order (runs are in
    the dict's order, and a run keeps it within a text), as ``heapq.merge`` and a stable
    sort would."""
    while heap:
        _, i, key = heap[0]
        run = runs[i]
        if run:
            following, text = run.popitem()
            heapreplace(heap, (text, i, following))
        else:
            heappop(heap)
        yield key


def _item(mapping: dict[Any, Any], key: Any) -> tuple[Any, Any]:
    """The item of ``key`` (from the dict itself, as orjson reads a dict subclass)."""
    return key, dict.__getitem__(mapping, key)


def _is_numpy_float(obj: Any) -> bool:
    """A numpy float scalar or float array (``float_decimals`` rounds those too)."""
    return (
        type(obj).__module__ == "numpy"
        and getattr(obj, "dtype", None) is not None
        and (obj.dtype.kind == "f")
    )


def _round_numpy(obj: Any, n: int) -> Any:
    """A numpy float scalar or array rounded element by element as ``round(x, n)`` rounds a
    Python float (numpy's own ``round`` scales by 10**n and can differ in the last digit),
    in the same dtype."""
    if not hasattr(obj, "shape") or obj.shape == ():
        return type(obj)(round(float(obj), n))
    numpy = sys.modules["numpy"]  # loaded: we hold one of its arrays
    flat = [round(x, n) for x in obj.ravel().tolist()]
    return numpy.array(flat, dtype=obj.dtype).reshape(obj.shape)


def _is_ndarray(obj: object) -> bool:
    t = type(obj)
    return t.__name__ == "ndarray" and t.__module__ == "numpy"
