"""Recipe: use the encoder under trio.

``main(path)`` saves a ~30 MB document with ``trio.run`` while a probe on the same trio loop
measures how long it waited, and checks the file against ``orjson.dumps``
(``tests/test_docs.py`` runs it).
"""

from __future__ import annotations

import os
from typing import Any

import orjson
import trio

import encoder
from monitors import LagStats, LoopLagProbe

# --8<-- [start:trio]


async def save(doc: Any, path: str | os.PathLike[str]) -> int:
    """Encode on the trio loop (a checkpoint every 0.1 ms), write in trio's worker threads."""
    async with await trio.open_file(path, "wb") as f:
        return await encoder.adump(doc, f.write, chunk_size=1 << 20)


async def save_while_serving(doc: Any, path: str | os.PathLike[str]) -> tuple[int, LagStats]:
    # LoopLagProbe is a task that asks to wake every 1 ms: it stands for the rest of the
    # program, and measures how late it woke while the document was encoded.
    async with LoopLagProbe() as probe:
        written = await save(doc, path)
    return written, probe.stats()


# --8<-- [end:trio]


def main(path: str | os.PathLike[str]) -> LagStats:
    doc = {
        "id": "episode-1",
        "turns": [{"content": "\u00e9t\u00e9 " * 100_000 + str(i)} for i in range(50)],
        "logprobs": [-0.25] * 1_000_000,
    }
    written, lag = trio.run(save_while_serving, doc, path)
    with open(path, "rb") as f:
        assert f.read() == orjson.dumps(doc)
    print(f"wrote {written / 1e6:.1f} MB under trio; {lag}")
    return lag


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        main(os.path.join(tmp, "doc.json"))
