"""The benchmark's earlier episode shape, kept as a second row: text-heavy episodes.

Before the benchmarks built episodes in verifiers' real record schema
(``monitors.testing.episodes``, ~80% per-token arrays), they built these.
``make_episode(target_bytes, seed=...)`` returns a dict whose ``orjson.dumps`` is within ~1% of
``target_bytes`` (~3% for the smallest allowed, 50 kB): about three quarters text (system
prompts, user turns, assistant content and reasoning, tool calls and long tool outputs; mostly
ASCII, some Latin-1, CJK and emoji, with quotes, backslashes, newlines and the odd control
character) and one quarter per-token arrays (``token_ids``, ``mask``, ``logprobs`` with
full-precision floats).

Every call builds a fresh copy: text is sliced out of a per-seed pool (a slice is a new ``str``
object, so orjson's UTF-8 cache from an earlier encoding never carries over) and every list and
dict is new. The same ``(target_bytes, seed)`` always gives the same content. Memory stays
small however many episodes are made: only a few pools (~3 MB each) are kept.
"""

# ruff: noqa: RUF001  (the look-alike characters in the text vocabulary are the point)
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

import numpy as np
import orjson

from monitors.testing.episodes import _ASCII_WORDS as _EPISODE_WORDS

__all__ = ["MIN_BYTES", "make_episode"]

#: Smallest episode made (below this the fixed structure dominates and sizes drift).
MIN_BYTES: Final = 50_000

#: Share of an episode's JSON bytes spent on token arrays (the rest is text and structure).
TOKEN_SHARE: Final = 0.25
#: Estimated JSON bytes per token across the three arrays (6-digit id, 0/1, 17-digit float,
#: three commas); calibration corrects the estimate.
_BYTES_PER_TOKEN: Final = 29.0
_VOCAB_SIZE: Final = 151_000

# The plain-text vocabulary is the one episode maker's (monitors.testing.episodes).
_ASCII_WORDS: Final = list(_EPISODE_WORDS)
_ASCII_SPECIAL: Final = (
    '"quoted"',
    "'single'",
    "C:\\Users\\dev\\project",
    "\\d+\\s*\\w+",
    "\\n",
    "path/to/file.py",
    "x == y",
    "a != b",
    "{key: value}",
    "[1, 2, 3]",
    "f(x) = x^2 + 1",
    '<tag attr="v">',
    "https://example.com/a?b=c&d=e",
    "snake_case_name",
    "CamelCaseName",
    "--flag=value",
    "$HOME",
    "#comment",
    "`code`",
    "**bold**",
    "\x1b[31mred\x1b[0m",
)
_BMP_WORDS: Final = (
    "é",
    "café",
    "naïve",
    "résumé",
    "über",
    "señor",
    "—",
    "–",
    "…",
    "“quote”",
    "‘single’",
    "→",
    "≤",
    "≥",
    "±",
    "×",
    "Ω",
    "π",
    "∑",
    "中文",
    "日本語",
    "한국어",
    "Привет",
    "Ελληνικά",
    "°C",
    "€",
)
_ASTRAL_WORDS: Final = ("😀", "🚀", "🤖", "👍🏽", "🎉", "🔥", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝑥²", "🧠")
_SEPARATORS: Final = (" ", " ", " ", " ", " ", " ", ", ", ". ", ".\n", "\n", "\n\n", "\t", ": ")

_POOL_CHARS: Final = {"ascii": 1 << 20, "bmp": 1 << 19, "astral": 1 << 18}
#: How often a text is drawn from each pool (ASCII only; plus Latin-1/BMP; plus emoji).
_POOL_WEIGHTS: Final = {"ascii": 0.55, "bmp": 0.35, "astral": 0.10}
_TOOLS: Final = ("python", "bash", "search", "read_file", "write_file", "calculator", "browse")
_MIN_TEXT: Final = 16


@dataclass(frozen=True)
class _Pool:
    text: str
    bytes_per_char: float  # JSON bytes (escapes included) per character, measured once


@lru_cache(maxsize=4)
def _pools(seed: int) -> dict[str, _Pool]:
    """Three text pools for a seed: pure ASCII, ASCII with BMP characters, and with emoji."""
    rng = random.Random(f"pool-{seed}")
    words = _ASCII_WORDS + list(_ASCII_SPECIAL)
    weights = [1.0] * len(_ASCII_WORDS) + [0.25] * len(_ASCII_SPECIAL)
    pools: dict[str, _Pool] = {}
    for kind, chars in _POOL_CHARS.items():
        vocab, w = list(words), list(weights)
        if kind in ("bmp", "astral"):
            vocab += _BMP_WORDS
            w += [0.35] * len(_BMP_WORDS)
        if kind == "astral":
            vocab += _ASTRAL_WORDS
            w += [0.3] * len(_ASTRAL_WORDS)
        n = chars // 5 + 16
        picked = rng.choices(vocab, w, k=n)
        seps = rng.choices(_SEPARATORS, k=n)
        text = "".join([p for pair in zip(picked, seps, strict=True) for p in pair])[:chars]
        # Measure on a copy so the pool itself never carries orjson's UTF-8 cache.
        probe = text[1:]
        per_char = (len(orjson.dumps(probe)) - 2) / len(probe)
        del probe
        pools[kind] = _Pool(text, per_char)
    return pools


class _Texts:
    """Hands out fresh ``str`` objects sliced from the pools, at reproducible offsets."""

    def __init__(self, seed: int) -> None:
        self.pools = _pools(seed)
        self.rng = random.Random(f"offsets-{seed}")

    def take(self, kind: str, n: int) -> str:
        """``n`` characters (at least ``_MIN_TEXT``) as a new str object."""
        pool = self.pools[kind].text
        n = max(n, _MIN_TEXT)
        cap = len(pool) - 1  # never the whole pool: ``pool[0:len]`` is the pool itself
        parts: list[str] = []
        while n > 0:
            k = min(n, cap)
            off = int(self.rng.random() * (len(pool) - k))
            parts.append(pool[off : off + k])
            n -= k
        return parts[0] if len(parts) == 1 else "".join(parts)

    def chars_for(self, kind: str, nbytes: float) -> int:
        return max(_MIN_TEXT, round(nbytes / self.pools[kind].bytes_per_char))


@dataclass
class _NodePlan:
    role: str
    kind: str  # which text pool
    content: float  # weights, turned into bytes by the text budget
    reasoning: float
    tool_calls: list[tuple[str, str, int]]  # (call id, tool name, argument chars)


def _plan(target: int, rng: random.Random) -> tuple[list[list[_NodePlan]], dict[str, Any]]:
    """The episode's shape: traces of nodes with relative text weights (size-independent)."""
    n_traces = 1 + rng.randint(0, 2) + int(math.log2(max(1.0, target / 1e6)))
    kinds = list(_POOL_WEIGHTS)
    kind_w = list(_POOL_WEIGHTS.values())
    traces: list[list[_NodePlan]] = []
    for _ in range(n_traces):
        n_nodes = rng.randint(6, 30)
        kind = rng.choices(kinds, kind_w)[0]
        nodes = [_NodePlan("system", kind, 0.6 * rng.lognormvariate(0, 0.4), 0.0, [])]
        nodes.append(_NodePlan("user", kind, rng.lognormvariate(-0.5, 1.0), 0.0, []))
        while len(nodes) < n_nodes:
            kind = rng.choices(kinds, kind_w)[0]
            calls = [
                (f"call_{rng.getrandbits(64):016x}", rng.choice(_TOOLS), rng.randint(40, 1200))
                for _ in range(rng.choice((0, 0, 1, 1, 1, 2)))
            ]
            content = rng.lognormvariate(-0.3, 1.0)
            reasoning = rng.lognormvariate(0.3, 1.0)
            nodes.append(_NodePlan("assistant", kind, content, reasoning, calls))
            if calls:
                for _call in calls:
                    k = rng.choices(kinds, kind_w)[0]
                    nodes.append(_NodePlan("tool", k, rng.lognormvariate(0.4, 1.3), 0.0, []))
            else:
                nodes.append(_NodePlan("user", kind, rng.lognormvariate(-0.5, 1.0), 0.0, []))
        traces.append(nodes)
    meta = {
        "env_id": rng.choice(("math-python", "wiki-search", "swe-lite", "code-contests")),
        "model": rng.choice(("Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B", "meta-llama/Llama-3.1-8B")),
        "example_id": rng.randrange(1_000_000),
        "run_id": f"run-{rng.getrandbits(48):012x}",
        "temperature": rng.choice((0.6, 0.7, 1.0)),
        "difficulty": rng.choice(("easy", "medium", "hard")),
        "reward": round(rng.random(), 4),
        "step": rng.randrange(10_000),
        "id": f"{rng.getrandbits(128):032x}",
        "timing": [round(rng.uniform(10, 90_000), 3) for _ in range(3)],
    }
    return traces, meta


def _build(target: int, seed: int, scale: float) -> dict[str, Any]:
    """One fresh episode; ``scale`` multiplies every text and token length (calibration)."""
    rng = random.Random(f"plan-{seed}-{target}")
    traces_plan, meta = _plan(target, rng)
    texts = _Texts(seed)
    nprng = np.random.default_rng([seed, target])

    total_w = sum(n.content + n.reasoning for t in traces_plan for n in t)
    text_bytes = (1.0 - TOKEN_SHARE) * target * scale
    n_tokens = TOKEN_SHARE * target * scale / _BYTES_PER_TOKEN
    per_weight_bytes = text_bytes / total_w
    per_weight_tokens = n_tokens / total_w

    traces: list[dict[str, Any]] = []
    for ti, plan in enumerate(traces_plan):
        nodes: list[dict[str, Any]] = []
        for node_plan in plan:
            kind = node_plan.kind
            node: dict[str, Any] = {
                "role": node_plan.role,
                "content": texts.take(
                    kind, texts.chars_for(kind, node_plan.content * per_weight_bytes)
                ),
            }
            if node_plan.role == "assistant":
                node["reasoning"] = texts.take(
                    kind, texts.chars_for(kind, node_plan.reasoning * per_weight_bytes)
                )
                node["tool_calls"] = [
                    {
                        "id": call_id,
                        "name": name,
                        "arguments": orjson.dumps(
                            {"query": texts.take(kind, chars), "limit": chars % 50, "strict": True}
                        ).decode(),
                    }
                    for call_id, name, chars in node_plan.tool_calls
                ]
            n = max(1, round((node_plan.content + node_plan.reasoning) * per_weight_tokens))
            node["token_ids"] = nprng.integers(0, _VOCAB_SIZE, size=n).tolist()
            node["mask"] = [1 if node_plan.role == "assistant" else 0] * n
            node["logprobs"] = (-nprng.exponential(0.35, size=n)).tolist()
            nodes.append(node)
        traces.append({"id": f"{meta['id']}-{ti}", "nodes": nodes})

    return {
        "id": meta["id"],
        "step": meta["step"],
        "reward": meta["reward"],
        "metadata": {
            "env_id": meta["env_id"],
            "model": meta["model"],
            "run_id": meta["run_id"],
            "example_id": meta["example_id"],
            "sampling_args": {"temperature": meta["temperature"], "top_p": 1.0, "max_tokens": 8192},
            "info": {"difficulty": meta["difficulty"], "source": "synthetic", "seed": seed},
            "answer": texts.take("bmp", 200),
            "timing": dict(
                zip(("generation_ms", "scoring_ms", "total_ms"), meta["timing"], strict=True)
            ),
            "metrics": {"correct": meta["reward"] > 0.5, "num_turns": len(traces_plan[0])},
            "is_truncated": False,
        },
        "traces": traces,
    }


_scales: dict[tuple[int, int], float] = {}


def make_episode(target_bytes: int, *, seed: int) -> dict[str, Any]:
    """A fresh episode whose ``orjson.dumps`` is within ~1% of ``target_bytes`` (>= 100 kB).

    The first call for a ``(target_bytes, seed)`` also builds and measures a throwaway copy to
    calibrate lengths (remembered, so later calls build once).
    """
    if target_bytes < MIN_BYTES:
        raise ValueError(f"target_bytes must be at least {MIN_BYTES}, not {target_bytes}")
    key = (target_bytes, seed)
    scale = _scales.get(key)
    if scale is None:
        scale = 1.0
        for _ in range(3):
            size = len(orjson.dumps(_build(target_bytes, seed, scale)))
            if abs(size - target_bytes) <= 0.005 * target_bytes:
                break
            scale *= target_bytes / size
        _scales[key] = scale
    return _build(target_bytes, seed, scale)
