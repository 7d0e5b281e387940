"""``monitors._release.release``: what the monitor alone holds is let go of a bounded piece per
step; what anyone else still holds is never touched."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import anyio
import pytest
from verifiers.v1.episode import WireEpisode

from monitors._release import release
from monitors.testing import EpisodeMaker


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Box:
    """A plain object with a ``__dict__`` (as a pydantic model has) and weak references."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


def episode(size: int, seed: int = 3) -> Any:
    return WireEpisode.model_validate(EpisodeMaker(seed=seed).episode(size, index=0).to_record())


async def turns_taken(holder: list[Any], budget: float) -> int:
    """How many times ``release`` gave the loop a turn (a task counting its own turns)."""
    turns = 0

    async def count() -> None:
        nonlocal turns
        while True:
            await anyio.sleep(0)
            turns += 1

    async with anyio.create_task_group() as group:
        group.start_soon(count)
        await anyio.sleep(0)
        turns = 0
        await release(holder, budget=budget)
        group.cancel_scope.cancel()
    return turns


@pytest.mark.anyio
async def test_what_others_hold_is_never_changed() -> None:
    shared_list = [1.5] * 10_000
    shared = Box(values=shared_list, nested={"a": [Box(x=1)]})
    kept = episode(300_000)
    want = kept.to_record()
    holder: list[Any] = [Box(mine=[2.5] * 10_000, theirs=shared), kept, shared_list]
    await release(holder, budget=1e-6)
    assert holder == []
    assert shared.values == [1.5] * 10_000
    assert shared.values is shared_list
    assert shared.nested["a"][0].x == 1
    assert kept.to_record() == want


@pytest.mark.anyio
async def test_what_it_alone_holds_is_freed_in_pieces() -> None:
    """A 6.4 MB episode (about a million floats and ints) with a tiny budget: many turns,
    and at the end nothing of it is left."""
    gc.collect()
    item = Box(episode=episode(6_400_000), rows=[[float(i)] * 100 for i in range(1000)])
    gone = weakref.ref(item)
    holder: list[Any] = [item]
    del item
    turns = await turns_taken(holder, budget=1e-5)
    assert gone() is None
    assert turns > 50


@pytest.mark.anyio
async def test_a_cycle_is_taken_apart_or_left_to_the_collector() -> None:
    a = Box(items=[Box(n=i) for i in range(100)])
    a.items.append(a)  # a reference cycle: never "owned", never lost
    gone = weakref.ref(a)
    holder: list[Any] = [a]
    del a
    await release(holder)
    gc.collect()
    assert gone() is None
