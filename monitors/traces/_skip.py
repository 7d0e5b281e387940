"""Crossing the JSON values a byte scan does not look into, at C speed.

Two scanners read a record's line without parsing it: ``_outline`` finds its nodes' spans
for the trace browser (docs/design.md D19) and ``prime/_restamp`` stamps the run on it for
the outbox (D18). Both walk a few levels of the record and skip everything below them: a
string, or nested containers, of any size. ``Skipper`` is that skipping, the same for both.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import Final, TypeAlias

__all__ = ["Skipper"]

Buffer: TypeAlias = bytes | bytearray | mmap.mmap

_QUOTE: Final = 0x22
_BACKSLASH: Final = 0x5C
_OPEN_ARRAY: Final = 0x5B
_CLOSE_ARRAY: Final = 0x5D
_OPEN_OBJECT: Final = 0x7B
_CLOSE_OBJECT: Final = 0x7D


class Skipper:
    """Where a scan is inside a value it skips (a string, containers), and the crossing of it.

    The scan starts a value with ``in_string = True`` (at its opening quote) or by pushing
    the closing byte of a container onto ``deep``; ``skip`` then goes on until the value
    ends (the object is false again). Of the five bytes that matter (``"``, ``[``, ``]``,
    ``{``, ``}``) each is looked for again only once the scan has passed where it was last
    found, so ``find`` crosses each byte once per kind in C and Python runs once per quote or
    bracket. Scalars, commas and colons inside are not looked at.

    :param line: The bytes scanned.
    :param bad: The scanner's error for a byte offset and what is wrong there.
    """

    __slots__ = ("_bad", "_found_to", "_line", "_next", "deep", "in_string")

    def __init__(self, line: Buffer, bad: Callable[[int, str], ValueError]) -> None:
        self.deep = bytearray()  # the closing bytes of the containers being skipped
        self.in_string = False
        self._line = line
        self._bad = bad
        # The next '"', '[', ']', '{', '}' found from the scan's position on, each good until
        # the scan passes it; equal to _found_to where not found before it.
        self._next = [-1] * 5
        self._found_to = -1

    def __bool__(self) -> bool:
        """Whether the scan is inside a value it skips."""
        return self.in_string or bool(self.deep)

    def skip(self, pos: int, end: int, tokens: int) -> tuple[int, int]:
        """Go on from ``pos`` through the value being skipped, up to ``end`` or for ``tokens``
        tokens. Returns where the scan is and the tokens left; the value ended when the
        object is false.

        :raises ValueError: A bracket that does not close the container open there.
        """
        line, find, deep = self._line, self._line.find, self.deep
        in_string = self.in_string
        if self._found_to != end:  # a step's finds looked only as far as its end
            self._next = [p if p < self._found_to else -1 for p in self._next]
            self._found_to = end
        quote, open_array, close_array, open_object, close_object = self._next
        try:
            while tokens > 0:
                tokens -= 1
                if quote < pos:
                    quote = find(b'"', pos, end)
                    if quote < 0:
                        quote = end
                if in_string:
                    if quote >= end:
                        pos = end
                        break
                    pos = quote + 1
                    if line[quote - 1] == _BACKSLASH and _escaped(line, quote):
                        continue
                    in_string = False
                    if not deep:
                        break
                    continue
                if open_array < pos:
                    open_array = find(b"[", pos, end)
                    if open_array < 0:
                        open_array = end
                if close_array < pos:
                    close_array = find(b"]", pos, end)
                    if close_array < 0:
                        close_array = end
                if open_object < pos:
                    open_object = find(b"{", pos, end)
                    if open_object < 0:
                        open_object = end
                if close_object < pos:
                    close_object = find(b"}", pos, end)
                    if close_object < 0:
                        close_object = end
                at = min(quote, open_array, close_array, open_object, close_object)
                if at >= end:
                    pos = end
                    break
                pos = at + 1
                byte = line[at]
                if byte == _QUOTE:
                    in_string = True
                elif byte == _OPEN_ARRAY:
                    deep.append(_CLOSE_ARRAY)
                elif byte == _OPEN_OBJECT:
                    deep.append(_CLOSE_OBJECT)
                elif byte != deep[-1]:
                    raise self._bad(at, "a bracket that does not close the open one")
                else:
                    deep.pop()
                    if not deep:
                        break
        finally:
            self.in_string = in_string
            self._next = [quote, open_array, close_array, open_object, close_object]
        return pos, tokens


def _escaped(line: Buffer, at: int) -> bool:
    """Whether the quote at ``at`` is escaped: an odd run of backslashes before it, measured
    with ``rstrip`` over windows that double (a string's opening quote ends any run)."""
    stop, size = at, 64
    while True:
        start = max(stop - size, 0)
        kept = len(line[start:stop].rstrip(b"\\"))
        if kept or start == 0:
            return (at - start - kept) % 2 == 1
        stop, size = start, size * 2
