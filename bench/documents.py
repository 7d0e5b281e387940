"""The documents the benchmark encodes, each part rebuilt fresh on demand from a short spec.

A spec is ``episode:<bytes>:<index>`` (a fresh copy of that episode of the benchmarks' one
``EpisodeMaker``), ``text:<bytes>:<seed>`` (the earlier text-heavy shape, ``text_episodes``)
or ``corpus:<name>`` (a file of ``tests/corpus`` re-parsed with ``orjson.loads``), so a
subprocess can rebuild the same part.
"""

from __future__ import annotations

import lzma
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from monitors.testing.episodes import EpisodeMaker, lognormal_sizes

from .text_episodes import make_episode

__all__ = [
    "CORPUS",
    "CORPUS_FILES",
    "MB",
    "Document",
    "Part",
    "documents",
    "episode_maker",
    "fresh_episode",
]

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus"
CORPUS_FILES = ("twitter", "citm_catalog", "canada", "github")
MB = 1_000_000
EPISODE_SEED = 1
MIX_SEED = 0
MIX_INDEX = 1000  # the mix's episodes are numbered from here


@cache
def episode_maker() -> EpisodeMaker:
    """The benchmarks' episode maker, one per process: its bodies are built once and kept."""
    return EpisodeMaker(seed=EPISODE_SEED)


def fresh_episode(target_bytes: int, *, index: int) -> dict[str, Any]:
    """A fresh copy of episode ``index`` of about ``target_bytes`` of JSON: it shares no str,
    list or dict with anything encoded before (orjson caches UTF-8 inside non-ASCII strs).

    :param target_bytes: the episode's size.
    :param index: its number (its ids and content derive from it).
    """
    return episode_maker().episode(target_bytes, index=index).to_record(fresh=True)


@cache
def _corpus_bytes(name: str) -> bytes:
    with lzma.open(CORPUS / f"{name}.json.xz") as f:
        return f.read()


@dataclass(frozen=True)
class Part:
    spec: str

    def build(self) -> Any:
        """A fresh copy: a newly built episode, or a newly parsed corpus file."""
        kind, _, rest = self.spec.partition(":")
        if kind == "episode":
            size, index = rest.split(":")
            return fresh_episode(int(size), index=int(index))
        if kind == "text":
            size, seed = rest.split(":")
            return make_episode(int(size), seed=int(seed))
        if kind == "corpus":
            return orjson.loads(_corpus_bytes(rest))
        raise ValueError(f"unknown document spec {self.spec!r}")


@dataclass
class Document:
    name: str
    kind: str  # "episode" | "mix" | "text mix" | "corpus"
    parts: list[Part]
    sizes: list[int] = field(default_factory=list)  # orjson bytes of each part

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)

    def largest(self) -> Part:
        return max(zip(self.sizes, self.parts, strict=True), key=lambda sp: sp[0])[1]

    def measure(self) -> None:
        self.sizes = [len(orjson.dumps(part.build())) for part in self.parts]


def documents(mix_episodes: int) -> list[Document]:
    """Episodes of 1, 6.4 and 60 MB, a production mix (also in the earlier text-heavy shape),
    and the four corpus files (measured)."""
    docs = [
        Document(f"episode {label} MB", "episode", [Part(f"episode:{size}:0")])
        for label, size in (("1", 1 * MB), ("6.4", 6_400_000), ("60", 60 * MB))
    ]
    sizes = lognormal_sizes(mix_episodes, seed=MIX_SEED)
    parts = [Part(f"episode:{size}:{MIX_INDEX + i}") for i, size in enumerate(sizes)]
    docs.append(Document(f"production mix ({len(parts)} eps)", "mix", parts))
    # The same sizes in the earlier, text-heavy shape (~25% arrays): a second row, no target.
    text = [Part(f"text:{size}:{MIX_INDEX + i}") for i, size in enumerate(sizes)]
    docs.append(Document(f"text-heavy mix ({len(text)} eps)", "text mix", text))
    docs.extend(
        Document(f"{name}.json", "corpus", [Part(f"corpus:{name}")]) for name in CORPUS_FILES
    )
    for doc in docs:
        doc.measure()
    return docs
