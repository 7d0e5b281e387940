"""Production-like RL episodes for load tests and the demo, in little memory.

A load test has to push thousands of episodes of 1 to 60 MB (~8.5 GB of JSON for 1,000 of
them) through the monitors, and it must not need 8.5 GB of RAM to do so, nor spend minutes
building them. So the episodes here share their bulk: an ``EpisodeMaker`` builds at most
``BODIES`` (24) trace bodies, at log-spaced sizes from ~8 kB to ~32 MB of JSON, each built
once when first needed; an episode is a small object naming a few of them, whose
``to_record()`` returns a fresh top-level dict that holds the *same* trace dicts (and so the
same ``str`` objects). 1,000 production-sized episodes then cost ~100-200 MB of memory
however many times they are logged.

The shape is a verifiers-style rollout: episode -> traces -> nodes (system, user, assistant
and tool messages) with ``content``, assistant ``reasoning``, ``tool_calls`` whose
``arguments`` are JSON strings, and per-token ``token_ids``, ``mask`` and ``logprobs`` (about a
quarter of the bytes). Text is mostly ASCII, with some Latin-1/CJK and a little emoji, and
the quotes, backslashes and newlines that JSON must escape.

Every episode has a unique ``"id"`` (a ``TracesServer`` counts unique ids), its exact encoded
size in ``Episode.size`` (``len(orjson.dumps(episode.to_record()))``, without a newline), and
``EpisodeMaker.expected_pieces`` gives the bytes its JSON line must hold, piece by piece, so a
reader can check 8.5 GB of written records byte for byte without re-encoding any of them.

Everything is seeded: the same ``seed`` and arguments give the same episodes, byte for byte.

One caveat for benchmarks: orjson caches a UTF-8 copy inside every non-ASCII ``str`` it
encodes, so shared bodies are encoded from that cache after the first time, which favours
plain ``orjson.dumps`` (our encoder slices long strings and gains nothing from it). The
comparison is conservative for nodewise.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator
from typing import Any, Final

import orjson

__all__ = [
    "BODIES",
    "CAP_BYTES",
    "MEDIAN_BYTES",
    "MIN_BYTES",
    "P90_BYTES",
    "Episode",
    "EpisodeMaker",
    "lognormal_sizes",
]

#: Production episode sizes (DESIGN section 1): lognormal, median 6.4 MB, p90 17 MB (so the
#: mean is ~8.5 MB and p99 ~38 MB), capped at 60 MB.
MEDIAN_BYTES: Final = 6_400_000
P90_BYTES: Final = 17_000_000
CAP_BYTES: Final = 60_000_000
#: Smallest episode made: the smallest body plus the episode's own fields.
MIN_BYTES: Final = 16_000
#: How many distinct trace bodies exist, and their sizes (JSON bytes, log-spaced).
BODIES: Final = 24
_SMALLEST_BODY: Final = 8_000
_LARGEST_BODY: Final = 32_000_000
_Z90: Final = 1.2815515655446004  # standard normal quantile at 0.9

#: Share of a body's JSON bytes spent on the token arrays; JSON bytes per token across the
#: three arrays (a 6-digit id, 0/1, a ~19-character float, three commas).
_TOKEN_SHARE: Final = 0.25
_BYTES_PER_TOKEN: Final = 30.0
_VOCAB: Final = 151_000
_POOL_TOKENS: Final = 1 << 16

_ASCII_TEXT: Final = (
    "the of and to in is that for it as with was on be by this are or from at an which but not "
    "have has had were can will would should could may might must one two three first last "
    "model answer question step reason because therefore however so thus let we consider then "
    "value function return result error test file path data list dict string number integer "
    "float token reward episode policy gradient loss batch sample environment tool call output "
    "input user assistant system prompt context window sequence length memory time check verify "
    "compute solve equation proof lemma theorem case assume suppose given find show note hence "
    "import def class self None True False if else elif for while try except raise yield async "
    "await lambda print len range sorted open read write json numpy array shape dtype "
    "x y z i j k n m a b c 0 1 2 3 4 5 7 10 12 42 100 256 1024 3.14 2.718 1e-5 0x1F"
)
_ASCII_WORDS: Final = tuple(_ASCII_TEXT.split())
_ESCAPED: Final = (
    '"quoted"',
    "C:\\Users\\dev\\project",
    "\\d+\\s*\\w+",
    "path/to/file.py",
    "x == y",
    '<tag attr="v">',
    "https://example.com/a?b=c&d=e",
    "`code`",
    "\x1b[31mred\x1b[0m",
    "tab\there",
)
_BMP_WORDS: Final = (
    "é",
    "café",
    "naïve",
    "über",
    "—",
    "…",
    "“quote”",
    "→",
    "≤",
    "±",
    "π",
    "中文",
    "日本語",
    "한국어",
    "Привет",
    "Ελληνικά",
    "€",
)
_ASTRAL_WORDS: Final = ("😀", "🚀", "🤖", "👍🏽", "🎉", "🔥", "𝑥²", "🧠")
_SEPARATORS: Final = (" ", " ", " ", " ", " ", ", ", ". ", ".\n", "\n", "\n\n", ": ")
#: Characters in each text pool, and how often a message draws its text from each.
_POOLS: Final = {"ascii": 1 << 20, "bmp": 1 << 19, "astral": 1 << 17}
_POOL_WEIGHTS: Final = {"ascii": 0.7, "bmp": 0.25, "astral": 0.05}
_TOOLS: Final = ("python", "bash", "search", "read_file", "write_file", "calculator", "browse")
_ENVS: Final = ("math-python", "wiki-search", "swe-lite", "code-contests")
_MODELS: Final = ("Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B", "meta-llama/Llama-3.1-8B")


def lognormal_sizes(
    n: int,
    *,
    seed: int = 0,
    median: float = MEDIAN_BYTES,
    p90: float = P90_BYTES,
    cap: float = CAP_BYTES,
) -> list[int]:
    """``n`` episode sizes in bytes drawn from the lognormal with this ``median`` and ``p90``,
    clipped to ``[MIN_BYTES, cap]``. Seeded: the same arguments give the same sizes."""
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n!r}")
    if not MIN_BYTES <= median < p90:
        raise ValueError(f"need {MIN_BYTES} <= median < p90, not median={median}, p90={p90}")
    if cap < median:
        raise ValueError(f"cap ({cap}) must be at least the median ({median})")
    rng = random.Random(f"sizes-{seed}")
    mu = math.log(median)
    sigma = math.log(p90 / median) / _Z90
    return [max(MIN_BYTES, min(int(cap), round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


class Episode:
    """One episode: a unique ``id``, its exact JSON ``size`` and the trace bodies it holds.

    ``to_record()`` builds the JSON-ready dict on demand (what a monitor encodes); the traces
    in it are shared with every other episode that names the same bodies, so do not change
    them.
    """

    __slots__ = ("_maker", "bodies", "id", "index", "reward", "size")

    def __init__(
        self, maker: EpisodeMaker, *, index: int, id: str, reward: float, bodies: tuple[int, ...]
    ) -> None:
        self._maker = maker
        self.index = index
        self.id = id
        self.reward = reward
        self.bodies = bodies
        self.size = 0  # set by the maker once the bodies are known

    def __repr__(self) -> str:
        return f"Episode(id={self.id!r}, size={self.size}, traces={len(self.bodies)})"

    def head(self) -> dict[str, Any]:
        """The record without its traces: every field but ``"traces"`` (which comes last)."""
        i = self.index
        return {
            "id": self.id,
            "example_id": i * 7919 % 1_000_003,
            "reward": self.reward,
            "advantage": round(self.reward - 0.5, 4),
            "metadata": {
                "env_id": _ENVS[i % len(_ENVS)],
                "model": _MODELS[i % len(_MODELS)],
                "sampling_args": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 8192},
                "info": {"seed": self._maker.seed, "index": i, "source": "nodewise-loadtest"},
                "is_truncated": i % 13 == 0,
                "timing_ms": {"generation": 1000.0 + i % 9000, "scoring": 12.5 + i % 90},
            },
        }

    def to_record(self) -> dict[str, Any]:
        record = self.head()
        record["traces"] = [self._maker.body(b) for b in self.bodies]
        return record


class EpisodeMaker:
    """Makes seeded, production-like ``Episode`` objects that share ``BODIES`` trace bodies.

        maker = EpisodeMaker(seed=0)
        episodes = maker.episodes(1_000)                 # production sizes
        episodes = maker.episodes(10_000, size=2_200_000)  # all about 2.2 MB

    An episode of ``target`` bytes holds bodies picked (seeded) among the three largest that
    still fit, until less than the smallest body is left: its size is within ~2% of the target.
    Bodies are built on first use (~0.1 s per 10 MB) and kept; memory is about 1.5x the JSON
    size of the bodies in use (~150 MB when all 24 are).
    """

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        ratio: float = (_LARGEST_BODY / _SMALLEST_BODY) ** (1 / (BODIES - 1))
        #: The size each body is built for; ``body_size`` is what it really encodes to.
        self.targets: list[int] = [round(_SMALLEST_BODY * ratio**i) for i in range(BODIES)]
        self._bodies: dict[int, dict[str, Any]] = {}
        self._sizes: dict[int, int] = {}
        self._bytes: dict[int, bytes] = {}
        self._text: _Text | None = None

    # -- bodies -------------------------------------------------------------------------

    def body(self, i: int) -> dict[str, Any]:
        """Trace body ``i`` (0 is the smallest), built the first time it is asked for."""
        body = self._bodies.get(i)
        if body is None:
            if self._text is None:
                self._text = _Text(self.seed)
            target = self.targets[i]
            body = _build_body(target, i, self.seed, self._text)
            size = len(orjson.dumps(body))
            if abs(size - target) > 0.002 * target:  # once more, scaled: same shape, closer
                body = _build_body(round(target * target / size), i, self.seed, self._text)
            self._bodies[i] = body
        return body

    def body_size(self, i: int) -> int:
        """``len(orjson.dumps(body(i)))``, measured once."""
        size = self._sizes.get(i)
        if size is None:
            size = self._sizes[i] = len(orjson.dumps(self.body(i)))
        return size

    def body_bytes(self, i: int) -> bytes:
        """``orjson.dumps(body(i))``, kept once made: only checking records read back needs
        it (all 24 bodies hold ~100 MB of JSON, which a run itself never holds)."""
        data = self._bytes.get(i)
        if data is None:
            data = self._bytes[i] = orjson.dumps(self.body(i))
            self._sizes[i] = len(data)
        return data

    def forget_bytes(self) -> None:
        """Drop the bytes ``body_bytes`` kept."""
        self._bytes.clear()

    # -- episodes -----------------------------------------------------------------------

    def episode(self, target_bytes: int, *, index: int) -> Episode:
        """Episode number ``index`` of about ``target_bytes`` of JSON (at least ``MIN_BYTES``).

        The id depends on the seed and the index only, so indexes must differ for ids to.
        """
        if target_bytes < MIN_BYTES:
            raise ValueError(f"target_bytes must be at least {MIN_BYTES}, not {target_bytes}")
        rng = random.Random(f"episode-{self.seed}-{index}-{target_bytes}")
        digest = hashlib.blake2b(f"{self.seed}:{index}".encode(), digest_size=10).hexdigest()
        episode = Episode(
            self,
            index=index,
            id=f"ep-{self.seed}-{index:07d}-{digest}",
            reward=round(rng.random(), 4),
            bodies=(),
        )
        head = len(orjson.dumps({**episode.head(), "traces": []}))
        left = target_bytes - head
        picked: list[int] = []
        while True:
            fits = [i for i in range(BODIES) if self.body_size_estimate(i) + 1 <= left]
            if not fits:
                break
            i = rng.choice(fits[-3:])
            picked.append(i)
            left -= self.body_size_estimate(i) + 1
        if not picked:
            picked.append(0)
        rng.shuffle(picked)
        episode.bodies = tuple(picked)
        episode.size = head + sum(self.body_size(i) for i in picked) + len(picked) - 1
        return episode

    def body_size_estimate(self, i: int) -> int:
        """The size body ``i`` is built for (its real size is within a few percent). Plans
        use this, never a measured size, so an episode is the same whatever was made before
        it, and planning builds only the bodies it picks."""
        return self.targets[i]

    def episodes(
        self,
        n: int,
        *,
        size: int | None = None,
        median: float = MEDIAN_BYTES,
        p90: float = P90_BYTES,
        cap: float = CAP_BYTES,
        start: int = 0,
    ) -> list[Episode]:
        """``n`` episodes numbered from ``start``: all of about ``size`` bytes, or sizes drawn
        by ``lognormal_sizes`` (production's by default)."""
        if size is not None:
            sizes = [size] * n
        else:
            sizes = lognormal_sizes(n, seed=self.seed, median=median, p90=p90, cap=cap)
        return [self.episode(s, index=start + k) for k, s in enumerate(sizes)]

    # -- checking what was written ------------------------------------------------------

    def expected_pieces(self, episode: Episode) -> Iterator[bytes]:
        """The bytes of ``orjson.dumps(episode.to_record())``, in pieces (the head, each
        body, the separators), without building the whole line."""
        head = orjson.dumps({**episode.head(), "traces": []})
        yield head[:-2]  # ends with '"traces":['
        for k, i in enumerate(episode.bodies):
            if k:
                yield b","
            yield self.body_bytes(i)
        yield b"]}"

    def matches(self, line: bytes | bytearray | memoryview, episode: Episode) -> str | None:
        """None if ``line`` (without its newline) is exactly ``orjson.dumps`` of the
        episode's record, else what differs. Compares bytes piece by piece (memcmp speed)."""
        view = memoryview(line)
        if len(view) != episode.size:
            return f"{len(view)} bytes, expected {episode.size}"
        at = 0
        for piece in self.expected_pieces(episode):
            if view[at : at + len(piece)] != piece:
                return f"bytes {at}..{at + len(piece)} differ"
            at += len(piece)
        return None


# -- building a body ----------------------------------------------------------------------


class _Text:
    """Text pools (one ASCII, one with BMP characters, one with emoji) and token pools."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(f"text-{seed}")
        words = [*_ASCII_WORDS, *_ESCAPED]
        weights = [1.0] * len(_ASCII_WORDS) + [0.2] * len(_ESCAPED)
        self.pools: dict[str, str] = {}
        self.per_char: dict[str, float] = {}
        for kind, chars in _POOLS.items():
            vocab, w = list(words), list(weights)
            if kind != "ascii":
                vocab += _BMP_WORDS
                w += [0.3] * len(_BMP_WORDS)
            if kind == "astral":
                vocab += _ASTRAL_WORDS
                w += [0.3] * len(_ASTRAL_WORDS)
            n = chars // 4
            picked = rng.choices(vocab, w, k=n)
            seps = rng.choices(_SEPARATORS, k=n)
            text = "".join([p for pair in zip(picked, seps, strict=True) for p in pair])[:chars]
            self.pools[kind] = text
            sample = text[: 1 << 16]
            self.per_char[kind] = (len(orjson.dumps(sample)) - 2) / len(sample)
        self.token_ids = [rng.randrange(_VOCAB) for _ in range(_POOL_TOKENS)]
        self.logprobs = [-rng.expovariate(3.0) for _ in range(_POOL_TOKENS)]

    def take(self, rng: random.Random, kind: str, nbytes: float) -> str:
        """About ``nbytes`` of JSON string content (at least a few characters)."""
        pool = self.pools[kind]
        n = max(8, round(nbytes / self.per_char[kind]))
        parts: list[str] = []
        while n > 0:
            k = min(n, len(pool) - 1)
            at = rng.randrange(len(pool) - k)
            parts.append(pool[at : at + k])
            n -= k
        return parts[0] if len(parts) == 1 else "".join(parts)

    def tokens(self, rng: random.Random, n: int) -> tuple[list[int], list[float]]:
        """``n`` token ids and logprobs: slices of the pools (new lists, shared numbers)."""
        ids: list[int] = []
        logprobs: list[float] = []
        while len(ids) < n:
            k = min(n - len(ids), _POOL_TOKENS)
            at = rng.randrange(_POOL_TOKENS - k + 1)
            ids += self.token_ids[at : at + k]
            logprobs += self.logprobs[at : at + k]
        return ids, logprobs


def _build_body(target: int, number: int, seed: int, text: _Text) -> dict[str, Any]:
    """One trace: a conversation of nodes whose JSON is about ``target`` bytes."""
    rng = random.Random(f"body-{seed}-{number}")
    at = random.Random(f"offsets-{seed}-{number}")  # where text and tokens are sliced from
    kinds, kind_w = list(_POOL_WEIGHTS), list(_POOL_WEIGHTS.values())
    n_nodes = min(60, 4 + int(2 * math.log2(max(1.0, target / 10_000))) + rng.randint(0, 4))
    # (role, text pool, content weight, reasoning weight, tool calls as argument weights)
    plan: list[tuple[str, str, float, float, list[float]]] = [
        ("system", "ascii", 0.5 * rng.lognormvariate(0, 0.4), 0.0, []),
        ("user", rng.choices(kinds, kind_w)[0], rng.lognormvariate(-0.5, 0.8), 0.0, []),
    ]
    while len(plan) < n_nodes:
        kind = rng.choices(kinds, kind_w)[0]
        calls = [rng.lognormvariate(-2.5, 0.7) for _ in range(rng.choice((0, 1, 1, 2)))]
        plan.append(
            ("assistant", kind, rng.lognormvariate(-0.3, 0.9), rng.lognormvariate(0.3, 0.9), calls)
        )
        for _ in calls:
            plan.append(
                ("tool", rng.choices(kinds, kind_w)[0], rng.lognormvariate(0.4, 1.1), 0, [])
            )
        if not calls:
            plan.append(("user", kind, rng.lognormvariate(-0.6, 0.8), 0.0, []))
    total = sum(c + r + sum(a) for _, _, c, r, a in plan)
    per_weight = (1 - _TOKEN_SHARE) * target / total
    tokens_per_weight = _TOKEN_SHARE * target / _BYTES_PER_TOKEN / total
    nodes: list[dict[str, Any]] = []
    call_ids: list[str] = []
    for role, kind, content, reasoning, calls in plan:
        node: dict[str, Any] = {"role": role, "content": text.take(at, kind, content * per_weight)}
        if role == "tool" and call_ids:
            node["tool_call_id"] = call_ids.pop(0)
        if role == "assistant":
            node["reasoning"] = text.take(at, kind, reasoning * per_weight)
            node["tool_calls"] = []
            for weight in calls:
                call_id = f"call_{rng.getrandbits(64):016x}"
                call_ids.append(call_id)
                arguments = {
                    "query": text.take(at, kind, weight * per_weight),
                    "limit": rng.randint(1, 50),
                    "strict": rng.random() < 0.5,
                }
                node["tool_calls"].append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": rng.choice(_TOOLS),
                            "arguments": orjson.dumps(arguments).decode(),
                        },
                    }
                )
        n = max(1, round((content + reasoning + sum(calls)) * tokens_per_weight))
        ids, logprobs = text.tokens(at, n)
        node["token_ids"] = ids
        node["mask"] = [1 if role == "assistant" else 0] * n
        node["logprobs"] = logprobs
        nodes.append(node)
    return {
        "id": f"trace-{seed}-{number:02d}",
        "env_id": _ENVS[number % len(_ENVS)],
        "turns": len(nodes),
        "nodes": nodes,
    }
