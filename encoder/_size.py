"""The walker's "is this small?" checks, in C where the extension was built, else in Python.

Every check estimates JSON bytes from types and lengths only, and stops once past the limit,
so it costs far less than writing the value (docs/design.md D3). ``Sizer`` picks one of the
two implementations; both give the same estimates and the same plans.
"""

from __future__ import annotations

from gc import get_referents
from math import hypot
from operator import length_hint
from typing import Any, Final, TypeAlias

from ._settings import Settings

try:
    from . import _csize
except ImportError:  # built without a C compiler: the Python checks below serve instead
    _csize = None  # type: ignore[assignment]

__all__ = ["ALONE", "ALONE_BIG", "BIG", "RUN", "Segment", "Sizer"]

#: More than any limit: a value that must be walked, whatever its size.
BIG: Final = 1 << 62
_DEEP: Final = BIG + 1  # from _csize: nested deeper than orjson writes
_ORJSON_DEPTH: Final = 254
_LEVEL_SLICE: Final = 512
_NUMBERS: Final = (int, float)

#: Kinds of a planned segment: elements written together, or one element walked alone
#: (not plain JSON, or large).
RUN, ALONE, ALONE_BIG = 0, 1, 2
#: ``(start, end, kind)``, or for a large element that is short enough to be planned itself
#: ``(start, end, ALONE_BIG, sizes)``: its elements' estimates as far as they were measured
#: (-1 where not), so that planning it does not read them again. For a long list, the sizes
#: of its first 16 elements (what the C check reads before projecting a list too big).
Segment: TypeAlias = tuple[int, int, int] | tuple[int, int, int, tuple[int, ...]]


class Sizer:
    """The size checks of one walk (its limit, its leaf types, what it learnt of depth).

    :param settings: the walk's settings.
    :param native: use the C checks when they were built.
    """

    __slots__ = ("c", "check_types", "deep_skips", "leaves", "limit", "plain", "plan_elements")

    def __init__(self, settings: Settings, *, native: bool = True) -> None:
        self.c = _csize if native else None
        self.limit = settings.limits.group_bytes
        self.plan_elements = settings.limits.plan_elements
        self.leaves = settings.leaves
        self.plain = settings.plain
        self.check_types = settings.check_types
        self.deep_skips = 0  # estimates to skip (see ``size``)

    def size(self, level: list[Any]) -> int:
        """Estimated JSON bytes of the values in ``level`` and all they hold, or more than
        the limit (often ``BIG``) once past it or on meeting anything orjson might not write
        by itself."""
        if self.deep_skips:
            # Just below a subtree found deeper than orjson goes: too deep as well, most
            # likely; not looking again keeps a 100,000-deep chain linear.
            self.deep_skips -= 1
            return BIG
        if self.c is not None:
            total: int = self.c.size(level, self.limit, self.leaves)
            if total == _DEEP:
                self.deep_skips = _ORJSON_DEPTH
                return BIG
            return total
        return self._py_size(level)

    def numbers(self, values: list[Any] | tuple[Any, ...]) -> int:
        """Estimated JSON bytes of a list of ints, bools and floats, or ``BIG`` if it holds
        anything else."""
        if self.c is not None:
            return self.c.numbers(values)  # type: ignore[no-any-return]
        try:
            total = sum(values)
        except Exception:  # not plain numbers (numpy scalars overflow, say)
            return BIG
        t = type(total)
        if t is int:
            return 8 * len(values)
        if t is float:
            return 20 * len(values)
        return BIG

    def plan(self, block: Any, is_map: bool, sizes: tuple[int, ...] | None = None) -> list[Segment]:
        """Segments of a short block: runs of small elements written together (up to the
        limit each), and elements walked alone.

        ``sizes`` are estimates of the elements already measured by the plan that found this
        block's container too large (the C check only).
        """
        if self.c is not None and not self.deep_skips:
            segments, deep = self.c.plan(block, is_map, self.limit, self.leaves, sizes)
            if deep:
                self.deep_skips = _ORJSON_DEPTH
            return segments  # type: ignore[no-any-return]
        limit = self.limit
        plan: list[Segment] = []
        run_start = -1
        run_bytes = 0
        for idx in range(len(block)):
            if is_map:
                key, value = block[idx]
                size = self._estimate(value) + (len(key) if type(key) is str else 8)
            else:
                size = self._estimate(block[idx])
            if size > limit:
                if run_start >= 0:
                    plan.append((run_start, idx, RUN))
                    run_start = -1
                plan.append((idx, idx + 1, ALONE_BIG if size != BIG else ALONE))
                continue
            if run_start >= 0 and run_bytes + size > limit:
                plan.append((run_start, idx, RUN))
                run_start = -1
            if run_start < 0:
                run_start, run_bytes = idx, 0
            run_bytes += size
        if run_start >= 0:
            plan.append((run_start, len(block), RUN))
        return plan

    # -- the Python checks -----------------------------------------------------------------

    def _estimate(self, value: Any) -> int:
        """One element's estimate, more than the limit when it must be walked on its own."""
        t = type(value)
        if t is str:
            return len(value) + 2
        if t is int or t is float or t is bool or value is None:
            return 8
        if t is list or t is tuple:
            if len(value) > 256 and type(value[0]) in _NUMBERS:
                return self.numbers(value)
            return self.size([value])
        if t is dict:
            if len(value) > self.plan_elements:
                return self.size([value])
            # A record: its values one by one, so a long list of numbers in it is proven by
            # ``sum`` rather than explored; a nested dict is measured by ``size``.
            total = 8
            for key, item in value.items():
                total += self.size([item]) if type(item) is dict else self._estimate(item)
                total += len(key) + 8 if type(key) is str else 16
                if total > self.limit:
                    return total
            return total
        if t in self.plain:
            return 40  # date, time, datetime
        return BIG

    def _py_size(self, level: list[Any]) -> int:
        """``size`` with builtins: each level of the subtree costs a few C calls
        (``gc.get_referents`` for the next level; ``len``, ``hypot`` or ``length_hint`` for
        sizes), so a subtree that is too big is found so after about limit / 8 objects."""
        limit = self.limit
        plain = self.plain
        check_types = self.check_types
        total = 8 * len(level)
        levels = 0
        while level:
            levels += 1
            if levels > 2 * _ORJSON_DEPTH:
                self.deep_skips = _ORJSON_DEPTH
                return BIG  # orjson refuses deeper nesting anyway: walk it
            following: list[Any] = []
            n = len(level)
            for j in range(0, n, _LEVEL_SLICE):
                part = level if n <= _LEVEL_SLICE else level[j : j + _LEVEL_SLICE]
                if check_types and not plain.issuperset(map(type, part)):
                    return BIG
                if type(part[0]) in _NUMBERS:
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
                if total > limit:
                    return total
                below = get_referents(*part)
                total += 8 * len(below)
                if total > limit:
                    return total
                following += below
            level = following
        return total
