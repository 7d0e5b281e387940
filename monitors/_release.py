"""Let go of a large object a bounded piece per step, where the monitor holds its last reference.

Freeing a 60 MB verifiers episode is one C call chain that holds the event loop (and the GIL)
for ~10 ms: millions of floats and ints, each a separate object. When the caller logs an
episode and drops it, the monitor's own task holds the last reference, so that free would be a
step of ours. ``release`` takes such an object apart instead, its lists cut from the end a few
thousand items at a time, its dicts and models emptied a value at a time, giving the loop a
turn whenever ``budget`` is spent. What anyone else still references is never touched: an
object is taken apart only while this is its only holder (``sys.getrefcount``).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Final

import anyio

__all__ = ["release"]

#: Items cut from the end of a list of leaves in one go (~40 us of freeing).
_SLICE: Final = 4096
#: Values that hold nothing to take apart.
_LEAVES: Final = (int, float, str, bool, bytes, type(None))
_getrefcount = sys.getrefcount


async def release(holder: list[Any], *, budget: float = 0.001) -> None:
    """Let go of the objects in ``holder`` (emptied), a bounded amount of freeing per step.

    :param holder: A list that holds the objects; the caller keeps no other reference to
        them. An object that is referenced anywhere else is simply dropped (its memory stays
        with that other holder), never changed.
    :param budget: Seconds of freeing between two turns given to the loop.
    """
    stack: list[Any] = []
    deadline = time.perf_counter() + budget
    steps = 0
    while holder or stack:
        if not stack:
            item = holder.pop()
            if _owned(item):
                stack.append(item)
            del item
            continue
        top = stack[-1]
        t = type(top)
        if t is list:
            if not top:
                stack.pop()
            elif type(top[-1]) in _LEAVES:
                del top[-_SLICE:]
            else:
                item = top.pop()
                if _owned(item):
                    stack.append(item)
                del item
        elif t is dict:
            if not top:
                stack.pop()
            else:
                _, item = top.popitem()
                if _owned(item):
                    stack.append(item)
                del item
        else:
            # A pydantic model or any other object: its ``__dict__`` (held by it alone).
            stack.pop()
            attrs = getattr(top, "__dict__", None)
            if type(attrs) is dict and attrs and _getrefcount(top) <= 2:
                stack.append(attrs)
            del attrs
        del top
        steps += 1
        if not steps & 31 and time.perf_counter() > deadline:
            await anyio.sleep(0)
            deadline = time.perf_counter() + budget


def _owned(item: Any) -> bool:
    """Whether ``item`` (just taken from its container into the caller's local) has no
    holder but that local, and holds something to take apart."""
    # references: the caller's local and this call's argument (and getrefcount's own)
    return type(item) not in _LEAVES and _getrefcount(item) <= 3
