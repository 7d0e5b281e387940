"""The sans-IO core: walk a value one bounded step at a time and yield its JSON in pieces.

Nothing here does I/O or knows about event loops; the drivers in ``sync`` and ``aio`` decide
when to hand control back (docs/design.md D2). Every step does a bounded amount of work: a
group of small values handed to ``orjson.dumps`` whole, one slice of a long string, list or
array, or the bracket and key of a large container. What is "small" is decided by C-level
checks: the ``_csize`` extension when it was built, else builtins (``len``, ``sum``,
``gc.get_referents``), so the walk adds no per-element Python work (docs/design.md D3).
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from collections.abc import AsyncIterable, AsyncIterator, Callable, Generator, Iterator
from datetime import date, datetime, time
from gc import get_referents
from itertools import islice
from math import hypot
from operator import itemgetter, length_hint
from typing import Any, Final, TypeAlias

import orjson

from .errors import EncodeError, format_path
from .options import (
    OPT_APPEND_NEWLINE,
    OPT_INDENT_2,
    OPT_NON_STR_KEYS,
    OPT_PASSTHROUGH_DATACLASS,
    OPT_PASSTHROUGH_DATETIME,
    OPT_PASSTHROUGH_SUBCLASS,
    OPT_SERIALIZE_NUMPY,
    OPT_SORT_KEYS,
)

__all__ = ["AnextRequest", "Piece", "Walker"]

#: Estimated JSON bytes (string lengths, plus 8 a node) below which a group of values goes to
#: ``orjson.dumps`` in one call, so no step is long (docs/design.md D3).
GROUP_BYTES: Final = 128 * 1024
#: Numbers per slice of a list proven numeric by ``sum`` to start with; then adjusted so a
#: slice writes about ``NUMBER_SLICE_BYTES``.
NUMBERS_PER_SLICE: Final = 4096
NUMBER_SLICE_BYTES: Final = 64 * 1024
#: Characters per slice of a long string (64K chars is 64-256 KiB of output).
STR_SLICE: Final = 64 * 1024
#: Most elements of a list, dict or iterator looked at in one step.
MAX_GROUP: Final = 4096
#: Containers this short are planned element by element; longer ones are grouped adaptively.
PLAN_ELEMENTS: Final = 32
#: orjson calls ``default`` at most 255 times in a chain (its results being unsupported again);
#: we stop at the same place.
DEFAULT_CHAIN_LIMIT: Final = 255

try:
    from . import _csize
except ImportError:  # built without a C compiler: the checks below use builtins instead
    _csize = None  # type: ignore[assignment]

_dumps = orjson.dumps
_JSONEncodeError = orjson.JSONEncodeError
_NumberSum = (int, float)
_BIG: Final = 1 << 62
_DEEP: Final = _BIG + 1  # from _csize.size: nested deeper than orjson writes
_LEVEL_SLICE: Final = 512
_ORJSON_DEPTH: Final = 254  # orjson's own nesting limit

Piece: TypeAlias = bytes | memoryview


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
        "via",
        "whole",
    )

    def __init__(
        self,
        *,
        origin: object,
        path: tuple[bool, object] | None,
        depth: int,
        is_map: bool,
        block: list[Any] | tuple[Any, ...],
        source: Iterator[Any] | AsyncIterator[Any] | None = None,
        is_async: bool = False,
        whole: Any = None,
        groups: bool = True,
    ) -> None:
        self.origin = origin
        self.path = path
        self.depth = depth
        self.is_map = is_map
        self.source = source
        self.is_async = is_async
        # A list is its own block; a length change while we walk it is a caller's bug.
        self.whole = whole
        self.length = len(whole) if whole is not None else -1
        self.base = 0  # index of block[0] in the whole sequence
        self.group = 1 if groups else 0  # adaptive group size; 0: one element at a time
        self.cap = 0  # a group may not reach past this index (a larger one was too big)
        self.numbers = NUMBERS_PER_SLICE
        self.first = True
        self.closer = b"}" if is_map else b"]"
        self.block = block
        self.i = 0  # next element of the block (adaptive) or next segment (planned)
        self.plan: list[Segment] | None = None
        self.prefix = 0  # a long list's first elements, planned; the rest grouped adaptively
        self.via: list[int] = []  # objects ``default`` turned into this one (cycle check)


#: Kinds of a planned segment: elements written together, or one element walked alone.
_RUN, _ALONE, _ALONE_BIG = 0, 1, 2
#: ``(start, end, kind)``, or for a large element that is short enough to be planned itself
#: ``(start, end, _ALONE_BIG, sizes)``: its elements' estimates as far as they were measured
#: (-1 where not), so that planning it does not read them again. For a long list, the sizes
#: of its first 16 elements (what the C check reads before projecting a list too big).
Segment: TypeAlias = tuple[int, int, int] | tuple[int, int, int, tuple[int, ...]]


class _Text:
    """A long string written one slice at a time."""

    __slots__ = ("i", "path", "text", "via")

    def __init__(self, text: str, path: tuple[bool, object] | None) -> None:
        self.text = text
        self.path = path
        self.i = 0
        self.via: list[int] = []


class _Array:
    """A large numpy array written along axis 0, a few rows per step."""

    __slots__ = ("array", "depth", "first", "i", "path", "rows", "via")

    def __init__(self, array: Any, path: tuple[bool, object] | None, depth: int) -> None:
        self.array = array
        self.path = path
        self.depth = depth
        self.via: list[int] = []
        self.i = 0
        self.first = True
        per_row = array.size // len(array) if len(array) else 1
        self.rows = max(1, NUMBERS_PER_SLICE // max(per_row, 1))


_Frame: TypeAlias = _Container | _Text | _Array


class _Unsupported(Exception):
    """Raised by the probe ``default`` when orjson asks what to do with an object."""


def _probe_default(obj: object) -> Any:
    raise _Unsupported


class Walker:
    """One encoding of one value: iterate it to get the JSON as pieces (bytes or memoryview).

    ``allow_async`` lets the walk meet async iterables (it then yields ``AnextRequest``).
    """

    def __init__(
        self,
        obj: Any,
        *,
        option: int = 0,
        default: Callable[[Any], Any] | None = None,
        iterables: bool = False,
        float_decimals: int | None = None,
        allow_async: bool = False,
    ) -> None:
        if not isinstance(option, int) or isinstance(option, bool):
            raise EncodeError("Invalid opts")
        try:
            _dumps(None, option=option)  # refused exactly when orjson refuses it
        except _JSONEncodeError:
            raise EncodeError("Invalid opts") from None
        if default is not None and not callable(default):
            raise EncodeError("default must be callable")
        if float_decimals is not None and (
            not isinstance(float_decimals, int) or not 0 <= float_decimals <= 17
        ):
            raise ValueError("float_decimals must be an int from 0 to 17")
        self.obj = obj
        self.option = option
        self.inner = option & ~OPT_APPEND_NEWLINE
        self.default = default
        self.iterables = iterables
        self.decimals = float_decimals
        self.allow_async = allow_async
        self.indent = bool(option & OPT_INDENT_2)
        self.sort = bool(option & OPT_SORT_KEYS)
        self.non_str_keys = bool(option & OPT_NON_STR_KEYS)
        self.subclasses = not option & OPT_PASSTHROUGH_SUBCLASS
        self.dataclasses = not option & OPT_PASSTHROUGH_DATACLASS
        self.numpy = bool(option & OPT_SERIALIZE_NUMPY)
        self.key_option = option & ~(OPT_INDENT_2 | OPT_APPEND_NEWLINE | OPT_SORT_KEYS)
        plain: set[type] = {str, int, float, bool, type(None), list, dict, tuple}
        if not option & OPT_PASSTHROUGH_DATETIME:
            plain |= {datetime, date, time}
        self.plain = frozenset(plain)
        # Types need checking only for numpy arrays (large, yet invisible to ``size``) and where
        # orjson's bytes change (rounding, re-indenting); else ``_probe_default`` catches them.
        self.check_types = bool(option & (OPT_SERIALIZE_NUMPY | OPT_INDENT_2)) or (
            float_decimals is not None
        )
        self.leaves = tuple(plain - {str, int, float, bool, type(None), list, dict, tuple})
        self.csize = _csize
        self.stack: list[_Frame] = []
        self.active: set[int] = set()
        self.deep_skips = 0  # estimates to skip (see ``size``)
        self._newlines: list[bytes] = [b"\n"]

    # -- small helpers ---------------------------------------------------------------------

    def newline(self, depth: int) -> bytes:
        """``\\n`` and the indentation of ``depth`` levels (OPT_INDENT_2)."""
        lines = self._newlines
        while len(lines) <= depth:
            lines.append(b"\n" + b"  " * len(lines))
        return lines[depth]

    def size(self, level: list[Any]) -> int:
        """Estimated JSON bytes of the values in ``level`` and all they hold, or more than
        ``GROUP_BYTES`` (often ``_BIG``) once past it or on meeting anything orjson might not
        write by itself (checked only where it can matter).

        Each level of the subtree costs a few C calls: ``gc.get_referents`` for the next level,
        and ``len`` (``hypot`` for all-number slices, ``length_hint`` for mixed ones) for
        string and container sizes.
        """
        if self.deep_skips:
            # Just below a subtree found deeper than orjson goes: too deep as well, most
            # likely; not looking again keeps a 100,000-deep chain linear.
            self.deep_skips -= 1
            return _BIG
        if self.csize is not None:
            total = self.csize.size(level, GROUP_BYTES, self.leaves)
            if total == _DEEP:
                self.deep_skips = _ORJSON_DEPTH
                return _BIG
            return total
        plain = self.plain
        check_types = self.check_types
        total = 8 * len(level)
        levels = 0
        while level:
            levels += 1
            if levels > 2 * _ORJSON_DEPTH:
                self.deep_skips = _ORJSON_DEPTH
                return _BIG  # orjson refuses deeper nesting anyway: walk it
            # A level is measured, and the next one gathered, a slice at a time: a subtree
            # that is too big is found so after about GROUP_BYTES / 8 objects looked at.
            following: list[Any] = []
            n = len(level)
            for j in range(0, n, _LEVEL_SLICE):
                part = level if n <= _LEVEL_SLICE else level[j : j + _LEVEL_SLICE]
                if check_types and not plain.issuperset(map(type, part)):
                    return _BIG
                if type(part[0]) in _NumberSum:
                    try:
                        # Only numbers (``hypot`` takes nothing else and, unlike ``sum``,
                        # never adds up arrays): nothing below them.
                        hypot(*part)
                        continue
                    except (TypeError, ValueError, OverflowError):
                        pass
                try:
                    total += sum(map(len, part))  # string characters, container items
                except TypeError:
                    total += sum(map(length_hint, part))
                if total > GROUP_BYTES:
                    return total
                below = get_referents(*part)
                total += 8 * len(below)
                if total > GROUP_BYTES:
                    return total
                following += below
            level = following
        return total

    def error(self, message: str, *, extra: tuple[bool, object] | None = None) -> EncodeError:
        parts = [f.path for f in self.stack if f.path is not None]
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

    def dump_whole(self, value: Any, depth: int) -> Piece:
        """orjson's bytes for a small value in place, indented for ``depth``."""
        if self.decimals is not None:
            value = self.rounded(value)
        out = _dumps(value, option=self.inner, default=_probe_default)
        if self.indent and depth:
            return out.replace(b"\n", self.newline(depth))
        return out

    def key_bytes(self, key: Any) -> bytes:
        """A dict key as orjson writes it (quoted, before the colon)."""
        if type(key) is str:
            try:
                return _dumps(key)
            except _JSONEncodeError as exc:
                raise self.error(str(exc), extra=(True, key)) from None
        if not self.non_str_keys:
            raise self.error("Dict key must be str", extra=(True, key))
        try:
            return _dumps({key: None}, option=self.key_option)[1:-6]
        except _JSONEncodeError as exc:
            raise self.error(str(exc), extra=(True, key)) from None

    def map_items(self, mapping: Any) -> list[Any] | Iterator[Any]:
        """The items of a dict in the order orjson writes them: a list when sorted or short,
        else an iterator (so a huge dict is never copied in one step)."""
        if not self.sort:
            if len(mapping) <= PLAN_ELEMENTS:
                return list(dict.items(mapping))
            return iter(dict.items(mapping))
        items = list(dict.items(mapping))
        if all(type(k) is str for k, _ in items):
            items.sort(key=itemgetter(0))
        else:
            # orjson sorts by the text each key becomes (not its quoted, escaped form).
            keyed = [(orjson.loads(self.key_bytes(k)), k, v) for k, v in items]
            keyed.sort(key=itemgetter(0))
            items = [(k, v) for _, k, v in keyed]
        return items

    # -- the walk ----------------------------------------------------------------------------

    def __iter__(self) -> Generator[Piece | AnextRequest, Any, None]:
        return self.walk()

    def walk(self) -> Generator[Piece | AnextRequest, Any, None]:
        """Yield the JSON of the value in pieces, one bounded step at a time.

        A step that writes nothing yields ``b""``, so a driver can look at its clock.
        """
        stack = self.stack
        out: list[Piece] = []
        self.enter(self.obj, None, 0, 0, out)
        yield from out
        while stack:
            out.clear()
            frame = stack[-1]
            if type(frame) is _Container:
                request = self.step_container(frame, out)
                if request is not None:
                    self.received(frame, (yield request))
            elif type(frame) is _Text:
                self.step_text(frame, out)
            else:
                assert type(frame) is _Array
                self.step_array(frame, out)
            if out:
                yield from out
            else:
                yield b""
        if self.option & OPT_APPEND_NEWLINE:
            yield b"\n"

    def enter(
        self,
        obj: Any,
        path: tuple[bool, object] | None,
        depth: int,
        chain: int,
        out: list[Piece],
        *,
        big: bool = False,
        sizes: tuple[int, ...] | None = None,
    ) -> None:
        """Write ``obj`` whole if it is small, else push a frame that walks it.

        ``big`` says the caller already found it too large to write whole; ``sizes`` are
        its elements' estimates, as far as that plan measured them (see ``Segment``).
        """
        t = type(obj)
        if t is str:
            if len(obj) <= STR_SLICE:
                out.append(self.dump_leaf(obj, path))
            else:
                self.stack.append(_Text(obj, path))
                out.append(b'"')
            return
        if (t is list or t is tuple) and obj and type(obj[0]) in _NumberSum:
            # A list of numbers, proven so by ``sum``: whole if short.
            if len(obj) <= NUMBERS_PER_SLICE and self.numbers_size(obj) != _BIG:
                try:
                    out.append(self.dump_whole(obj, depth))
                    return
                except _JSONEncodeError:
                    pass  # a bad number: walk it to find which
            big = True
        if t is dict and not big and len(obj) <= PLAN_ELEMENTS:
            # A record-like dict: plan it from its values (a long list of numbers among them
            # is then proven numeric by ``sum``, not explored); whole if the plan is one run.
            block = self.map_items(obj)
            assert isinstance(block, list)
            plan = self.plan(block, True)
            if len(plan) <= 1 and (not plan or plan[0][2] == _RUN):
                try:
                    out.append(self.dump_whole(obj, depth))
                    return
                except _JSONEncodeError:
                    plan = [(j, j + 1, _ALONE) for j in range(len(block))]
            self.push(obj, path, depth, is_map=True, block=block, whole=obj, plan=plan)
            out.append(b"{")
            return
        if t is dict or t is list or t is tuple:
            if not big and self.size([obj]) <= GROUP_BYTES:
                try:
                    out.append(self.dump_whole(obj, depth))
                    return
                except _JSONEncodeError:
                    pass  # too deep for orjson, or a bad leaf: walk it to find which
        elif t in self.plain:
            out.append(self.dump_leaf(obj, path))
            return
        if t is dict or (self.subclasses and isinstance(obj, dict)):
            # ``sizes`` follow the dict's own order, not a sorted one.
            known = sizes if t is dict and not self.sort else None
            self.push(
                obj, path, depth, is_map=True, block=self.map_items(obj), whole=obj, sizes=known
            )
            out.append(b"{")
        elif t is list or t is tuple:
            self.push(obj, path, depth, is_map=False, block=obj, whole=obj, sizes=sizes)
            out.append(b"[")
        elif self.subclasses and isinstance(obj, list):
            # The items themselves, as orjson takes them (not an overridden __getitem__).
            self.push(obj, path, depth, is_map=False, block=list.copy(obj), whole=obj)
            out.append(b"[")
        elif self.subclasses and isinstance(obj, str):
            # The characters themselves, as orjson takes them (not an overridden __str__).
            self.enter(str.__str__(obj), path, depth, chain, out)
        elif self.dataclasses and "__dataclass_fields__" in type(obj).__dict__:
            # orjson's test: the class itself was made by @dataclass (a plain subclass of one
            # is not a dataclass to it).
            # Field by field: orjson never sorts a dataclass's keys, so no group of them may
            # go through one orjson call with OPT_SORT_KEYS.
            fields = self.dataclass_items(obj)
            self.push(obj, path, depth, is_map=True, block=fields, groups=False)
            out.append(b"{")
        elif isinstance(obj, enum.Enum):
            self.enter(obj.value, path, depth, chain, out)
        elif self.numpy and _is_ndarray(obj) and self.array_walkable(obj):
            if obj.size <= NUMBERS_PER_SLICE or len(obj) == 0:
                out.append(self.dump_leaf(obj, path, depth))
            else:
                self.enter_container(obj, path)
                self.stack.append(_Array(obj, path, depth))
                out.append(b"[")
        elif self.iterables and isinstance(obj, Iterator):
            self.push(obj, path, depth, is_map=False, block=[], source=obj)
            out.append(b"[")
        elif self.iterables and isinstance(obj, AsyncIterable):
            if not self.allow_async:
                raise self.error(
                    "an async iterable can only be encoded by aiterencode or adump", extra=path
                )
            source = obj.__aiter__()
            self.push(obj, path, depth, is_map=False, block=[], source=source, is_async=True)
            out.append(b"[")
        else:
            try:
                out.append(self.dump_leaf(obj, path, depth, probe=self.default is not None))
            except _Unsupported:
                assert self.default is not None
                if chain >= DEFAULT_CHAIN_LIMIT:
                    raise self.error(
                        "default serializer exceeds recursion limit", extra=path
                    ) from None
                key = id(obj)
                if key in self.active:
                    raise self.error("Circular reference detected", extra=path) from None
                try:
                    value = self.default(obj)
                except Exception as exc:
                    raise self.error(
                        f"Type is not JSON serializable: {type(obj).__name__} "
                        f"(default raised {type(exc).__name__}: {exc})",
                        extra=path,
                    ) from exc
                # ``obj`` is on the path until what it became is written: meeting it again
                # below is a cycle, even when ``default`` builds fresh containers each time.
                self.active.add(key)
                height = len(self.stack)
                self.enter(value, path, depth, chain + 1, out)
                if len(self.stack) > height:
                    self.stack[height].via.append(key)
                else:
                    self.active.discard(key)

    def dump_leaf(
        self, obj: Any, path: tuple[bool, object] | None, depth: int = 0, *, probe: bool = False
    ) -> Piece:
        """orjson's bytes for one leaf; ``_Unsupported`` when ``probe`` and orjson would call
        ``default`` for it."""
        try:
            if probe:
                out = _dumps(obj, option=self.inner, default=_probe_default)
            elif self.decimals is not None and type(obj) is float:
                out = _dumps(round(obj, self.decimals), option=self.inner)
            elif self.decimals is not None and _is_numpy_float(obj):
                out = _dumps(_round_numpy(obj, self.decimals), option=self.inner)
            else:
                out = _dumps(obj, option=self.inner)
        except _JSONEncodeError as exc:
            if isinstance(exc.__cause__, _Unsupported):
                raise _Unsupported from None
            raise self.error(str(exc), extra=path) from None
        if self.indent and depth and b"\n" in out and not isinstance(obj, orjson.Fragment):
            return out.replace(b"\n", self.newline(depth))
        return out

    def dataclass_items(self, obj: Any) -> list[tuple[str, Any]]:
        """A dataclass's fields as orjson writes them: ``__dict__`` (or the declared fields for
        slotted classes), private (``_``) names left out, never sorted."""
        try:
            attrs = vars(obj)
        except TypeError:
            names: list[str] = [f.name for f in dataclasses.fields(obj)]
            return [(n, getattr(obj, n)) for n in names if not n.startswith("_")]
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

    def enter_container(self, obj: object, path: tuple[bool, object] | None) -> None:
        key = id(obj)
        if key in self.active:
            raise self.error("Circular reference detected", extra=path)
        self.active.add(key)

    def push(
        self,
        obj: Any,
        path: tuple[bool, object] | None,
        depth: int,
        *,
        is_map: bool,
        block: Any,
        whole: Any = None,
        source: Any = None,
        is_async: bool = False,
        groups: bool = True,
        plan: list[Segment] | None = None,
        sizes: tuple[int, ...] | None = None,
    ) -> None:
        self.enter_container(obj, path)
        if not isinstance(block, (list, tuple)):
            source, block = block, []
        frame = _Container(
            origin=obj,
            path=path,
            depth=depth,
            is_map=is_map,
            block=block,
            source=source,
            is_async=is_async,
            whole=whole,
            groups=groups,
        )
        if plan is not None:
            frame.plan = plan
        elif block and groups and len(block) <= PLAN_ELEMENTS:
            frame.plan = self.plan(block, is_map, sizes)
        elif groups and sizes is not None and not is_map and len(sizes) < len(block):
            # A long list whose first elements were measured by the plan that found it large:
            # they are planned from those sizes, not read again; the rest is grouped after.
            frame.prefix = len(sizes)
            frame.plan = self.plan(block[: frame.prefix], False, sizes)
            known = [size for size in sizes if 0 < size <= GROUP_BYTES]
            if known:
                frame.group = max(1, min(MAX_GROUP, len(known) * (GROUP_BYTES // 2) // sum(known)))
        self.stack.append(frame)

    def pop(self, frame: _Frame) -> None:
        self.stack.pop()
        active = self.active
        if type(frame) is _Container:
            active.discard(id(frame.origin))
        elif type(frame) is _Array:
            active.discard(id(frame.array))
        for key in frame.via:
            active.discard(key)

    def step_text(self, frame: _Text, out: list[Piece]) -> None:
        text, i = frame.text, frame.i
        if i >= len(text):
            self.pop(frame)
            out.append(b'"')
            return
        part = text[i : i + STR_SLICE]
        frame.i = i + STR_SLICE
        try:
            data = _dumps(part)
        except _JSONEncodeError as exc:
            raise self.error(str(exc)) from None
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
        if frame.rows == 1 and array[i].size > NUMBERS_PER_SLICE:
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

    # -- containers ----------------------------------------------------------------------

    def numbers_size(self, values: list[Any] | tuple[Any, ...]) -> int:
        """Estimated JSON bytes of a list of ints and floats, or ``_BIG`` if it holds
        anything else."""
        if self.csize is not None:
            return self.csize.numbers(values)
        return _numbers_size(values)

    def estimate(self, value: Any) -> int:
        """Estimated JSON bytes of one element, more than ``GROUP_BYTES`` when it must be
        walked on its own (large, a long list of numbers, or not a plain JSON type)."""
        t = type(value)
        if t is str:
            return len(value) + 2
        if self.csize is not None:
            return self.size([value])
        if t is int or t is float or t is bool or value is None:
            return 8
        if t is list or t is tuple:
            if len(value) > 256 and type(value[0]) in _NumberSum:
                return self.numbers_size(value)
            return self.size([value])
        if t is dict:
            if len(value) > PLAN_ELEMENTS:
                return self.size([value])
            # A record: its values one by one, so a long list of numbers in it is proven by
            # ``sum`` rather than explored; a nested dict is measured by ``size``.
            total = 8
            for key, item in value.items():
                total += self.size([item]) if type(item) is dict else self.estimate(item)
                total += len(key) + 8 if type(key) is str else 16
                if total > GROUP_BYTES:
                    return total
            return total
        if t in self.plain:
            return 40  # date, time, datetime
        return _BIG

    def plan(self, block: Any, is_map: bool, sizes: tuple[int, ...] | None = None) -> list[Segment]:
        """Segments of a short block: runs of small elements written together (up to
        ``GROUP_BYTES`` each), and elements walked alone.

        ``sizes`` are estimates of the elements already measured by the plan that found this
        block's container too large (the C check only).
        """
        if self.csize is not None and not self.deep_skips:
            segments, deep = self.csize.plan(block, is_map, GROUP_BYTES, self.leaves, sizes)
            if deep:
                self.deep_skips = _ORJSON_DEPTH
            return segments
        plan: list[Segment] = []
        run_start = -1
        run_bytes = 0
        estimate = self.estimate
        for idx in range(len(block)):
            if is_map:
                key, value = block[idx]
                size = estimate(value) + (len(key) if type(key) is str else 8)
            else:
                size = estimate(block[idx])
            if size > GROUP_BYTES:
                if run_start >= 0:
                    plan.append((run_start, idx, _RUN))
                    run_start = -1
                plan.append((idx, idx + 1, _ALONE_BIG if size != _BIG else _ALONE))
                continue
            if run_start >= 0 and run_bytes + size > GROUP_BYTES:
                plan.append((run_start, idx, _RUN))
                run_start = -1
            if run_start < 0:
                run_start, run_bytes = idx, 0
            run_bytes += size
        if run_start >= 0:
            plan.append((run_start, len(block), _RUN))
        return plan

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
            nxt = list(islice(frame.source, MAX_GROUP))  # type: ignore[arg-type]
        except RuntimeError as exc:
            raise self.error(str(exc)) from None
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
            self.plan(block, frame.is_map)
            if block and frame.group and len(block) <= PLAN_ELEMENTS
            else None
        )

    def step_planned(self, frame: _Container, plan: list[Segment], out: list[Piece]) -> None:
        segment = plan[frame.i]
        start, end, kind = segment[0], segment[1], segment[2]
        frame.i += 1
        block = frame.block
        if kind == _RUN:
            part = block[start:end]
            group: Any = dict(part) if frame.is_map else part
            try:
                if len(group) != len(part):
                    raise _JSONEncodeError("keys equal as Python values (1 and 1.0)")
                piece = self.dump_group(group, frame.depth)
            except _JSONEncodeError:
                # A bad value (or nesting orjson refuses) in the run: walk it one by one.
                plan[frame.i - 1 : frame.i] = [(j, j + 1, _ALONE) for j in range(start, end)]
                frame.i -= 1
                return
            if not frame.first:
                out.append(b",")
            frame.first = False
            out.append(piece)
            return
        sizes = segment[3] if len(segment) > 3 else None
        self.element(frame, start, out, big=kind == _ALONE_BIG, sizes=sizes)

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
        if frame.is_map:
            key, value = frame.block[i]
            out.append(self.key_bytes(key))
            out.append(b": " if self.indent else b":")
            path: tuple[bool, object] = (True, key)
        else:
            value = frame.block[i]
            path = (False, frame.base + i)
        self.enter(value, path, depth + 1, 0, out, big=big, sizes=sizes)

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

    def try_group(self, frame: _Container, block: Any, i: int, g: int) -> Piece | None:
        """Write ``g`` or so elements from ``block[i]`` in one orjson call, if they are small.

        Returns None (and shrinks ``frame.group``) when they are not.
        """
        depth = frame.depth
        if not frame.is_map and type(block[i]) in _NumberSum:
            n = frame.numbers
            part = block if i == 0 and len(block) <= n else block[i : i + n]
            if self.numbers_size(part) != _BIG:
                try:
                    piece = self.dump_group(part, depth)
                except _JSONEncodeError:
                    frame.group = 1
                    return None
                frame.i = i + len(part)
                if len(part) == n:
                    # Aim the next slice at NUMBER_SLICE_BYTES of output.
                    frame.numbers = min(
                        16 * NUMBERS_PER_SLICE,
                        max(256, n * NUMBER_SLICE_BYTES // max(len(piece), 1)),
                    )
                return piece
        if frame.cap > i:
            g = min(g, frame.cap - i)
        value = block[i][1] if frame.is_map else block[i]
        t = type(value)
        if t not in self.plain:
            # Not plain JSON (a dataclass, a subclass, ...): exploring it would wander into
            # its class; it is walked on its own.
            frame.group = 1
            return None
        long_numbers = (
            (t is list or t is tuple) and len(value) > 64 and type(value[0]) in _NumberSum
        )
        if g == 1 and long_numbers:
            # A list of numbers alone: ``enter`` proves it so more cheaply. (The group may
            # be larger than g, cut to 1 by ``cap``: it must shrink, or this step repeats.)
            frame.group = 1
            return None
        part = block[i : i + g]
        group: Any = dict(part) if frame.is_map else part
        if frame.is_map and len(group) != len(part):
            frame.group = 1  # keys equal as Python values (1 and 1.0): write one at a time
            return None
        size = self.size([group])
        if size > GROUP_BYTES:
            # Something in block[i:i+g] is large: no group may reach past it until it is found.
            frame.cap = i + g
            frame.group = 1 if size == _BIG or g == 1 else max(1, g * GROUP_BYTES // size // 4)
            return None
        try:
            piece = self.dump_group(group, depth)
        except _JSONEncodeError:
            frame.group = 1
            frame.cap = i + g
            return None
        frame.i = i + len(part)
        # Aim at half the limit, so that the next group rarely overshoots and is explored twice.
        frame.group = min(MAX_GROUP, g * 4, max(1, g * (GROUP_BYTES // 2) // max(size, 1)))
        return piece

    def close(self, frame: _Container, out: list[Piece]) -> None:
        self.pop(frame)
        if frame.first or not self.indent:
            out.append(frame.closer)
        else:
            out.append(self.newline(frame.depth) + frame.closer)


def _numbers_size(values: list[Any] | tuple[Any, ...]) -> int:
    """Estimated JSON bytes of a list proven to hold only numbers by ``sum`` (far cheaper than
    exploring it), or ``_BIG`` when it holds anything else (docs/design.md D3)."""
    try:
        total = sum(values)
    except Exception:  # not plain numbers (numpy scalars overflow, say)
        return _BIG
    t = type(total)
    if t is int:
        return 8 * len(values)
    if t is float:
        return 20 * len(values)
    return _BIG


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
