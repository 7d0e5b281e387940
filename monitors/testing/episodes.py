"""Production-like RL episodes in verifiers' record schema, for load tests and benchmarks.

An ``EpisodeMaker`` makes seeded episodes whose ``to_record()`` has the shape verifiers 0.4.0's
``Episode.to_record()`` gives: an envelope (``id``, ``env``, ``task``, ``group``, ``run``,
``ok``, ``errors``, token counts) around one trace per agent (a unique ``id``, the agent and
its config, ``nodes``, ``calls``, ``rewards``, ``metrics``, ``timing``, ...). A node holds a
message (system, user, tool, or assistant with ``reasoning_content`` and ``tool_calls``), its
``token_ids`` and boolean ``mask`` and ``is_content``; sampled (assistant) nodes also hold
``logprobs`` and ``advantages`` rounded to 4 decimals. The per-token arrays are ~80% of the
bytes, as in production. Text is mostly ASCII, with some Latin-1/CJK, a little emoji, and the
quotes, backslashes, newlines and control characters that JSON must escape.

Shared bodies: a load test pushes ~1,000 episodes of 1 to 60 MB (~8.5 GB of JSON) through the
monitors, and must not need 8.5 GB of memory or minutes of building for it. So a maker builds
at most ``BODIES`` trace bodies (a trace's ``tools``, ``nodes`` and ``calls``), log-spaced from
~8 kB to ~32 MB of JSON, each when first needed; an episode names a few of them. Its record
is a fresh envelope whose traces are small dicts of their own (each with its own id: the
Traces service refuses a trace id twice) holding the shared bodies' lists.

Exact sizes: ``Episode.size`` is ``len(orjson.dumps(episode.to_record()))``, within ~2% of
the target (the first trace's ``info`` carries plain text that makes up the difference), and
``EpisodeMaker.expected_pieces`` yields those bytes piece by piece, each body's bytes encoded
once, so a reader can check gigabytes of written lines byte for byte without re-encoding them.

Fresh copies: orjson caches a UTF-8 copy inside every non-ASCII ``str`` it encodes, so shared
bodies encode faster the second time. A benchmark encodes ``to_record(fresh=True)``, a copy
that shares no ``str``, list or dict with anything else.

Everything is seeded: the same seed and arguments give the same episodes, byte for byte.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections.abc import Iterator
from typing import Any, Final, NamedTuple

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

#: Production episode sizes: lognormal, median 6.4 MB, p90 17 MB (so the mean is ~8.5 MB and
#: p99 ~38 MB), capped at 60 MB.
MEDIAN_BYTES: Final = 6_400_000
P90_BYTES: Final = 17_000_000
CAP_BYTES: Final = 60_000_000
#: Smallest episode made (the smallest body with one trace's and the envelope's fields: ~12 kB).
MIN_BYTES: Final = 16_000
#: How many distinct trace bodies a maker builds, and their sizes (JSON bytes, log-spaced).
BODIES: Final = 24
_SMALLEST_BODY: Final = 8_000
_LARGEST_BODY: Final = 32_000_000
_Z90: Final = 1.2815515655446004  # standard normal quantile at 0.9

#: Planning estimates (JSON bytes) of the envelope and of one trace without its body.
_ENVELOPE_BYTES: Final = 1_300
_TRACE_BYTES: Final = 2_300
#: Estimated JSON bytes of a node's and a model call's own fields (without text or tokens).
_NODE_BYTES: Final = 300
_CALL_BYTES: Final = 450
#: A body is rebuilt, scaled, when its first build misses its target by more than this.
_BODY_TOLERANCE: Final = 0.002
#: JSON bytes of text per token of it (which makes the per-token arrays ~80% of the bytes).
_TEXT_BYTES_PER_TOKEN: Final = 5.5
#: Template scaffold tokens around a message (role header, end of turn).
_LEAD: Final = 3
_TAIL: Final = 2
_VOCAB: Final = 151_000
_POOL_TOKENS: Final = 1 << 16
#: Where a trace's per-episode fields meet its shared body: the skeleton record (built with
#: empty bodies) holds this once per trace, the real record the body's bytes in its place. It
#: cannot occur inside a JSON string, where every '"' is escaped.
_MARKER: Final = b'"tools":[],"nodes":[],"calls":[]'
#: Every record is made as verifiers 0.4.0 would dump it; epoch seconds the clocks start at.
_VERIFIERS: Final = "0.4.0"
_EPOCH: Final = 1_767_225_600.0

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
#: Characters in each text pool, and how often a message draws its text from each ("plain",
#: words and spaces only, so one byte of JSON per character, fills the size gap).
_POOLS: Final = {"ascii": 1 << 19, "bmp": 1 << 18, "astral": 1 << 17, "plain": 1 << 16}
_POOL_WEIGHTS: Final = {"ascii": 0.7, "bmp": 0.25, "astral": 0.05}
_TOOLS: Final = ("python", "bash", "search", "read_file", "write_file", "calculator", "browse")
_ENVS: Final = ("math-python", "wiki-search", "swe-lite", "code-contests")
_MODELS: Final = ("Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B", "meta-llama/Llama-3.1-8B")
_AGENTS: Final = ("solver", "critic", "verifier", "planner", "coder", "reviewer")


def lognormal_sizes(
    n: int,
    *,
    seed: int = 0,
    median: float = MEDIAN_BYTES,
    p90: float = P90_BYTES,
    cap: float = CAP_BYTES,
) -> list[int]:
    """``n`` episode sizes in bytes drawn from the lognormal with this ``median`` and ``p90``,
    clipped to ``[MIN_BYTES, cap]``. Seeded: the same arguments give the same sizes.

    :param n: how many sizes.
    :param seed: the sizes' seed.
    :param median: the distribution's median, in bytes.
    :param p90: its 90th percentile, in bytes.
    :param cap: the largest size returned.
    """
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
    """One episode: a unique ``id``, one unique id per trace, its exact JSON ``size`` and the
    numbers of the bodies its traces hold. Made by ``EpisodeMaker``.

    :ivar id: the episode's id (a UUID in hex, unique for the maker's seed, index and target).
    :ivar index: its number among the maker's episodes.
    :ivar size: ``len(orjson.dumps(self.to_record()))``.
    :ivar target: the size asked for.
    :ivar bodies: the body behind each trace, in the traces' order.
    :ivar trace_ids: each trace's id, in the same order.
    """

    __slots__ = ("_maker", "_pad", "bodies", "id", "index", "size", "target", "trace_ids")

    def __init__(
        self, maker: EpisodeMaker, *, index: int, target: int, bodies: tuple[int, ...]
    ) -> None:
        self._maker = maker
        self.index = index
        self.target = target
        self.bodies = bodies
        self.id = _uuid(f"episode-{maker.seed}-{index}-{target}")
        self.trace_ids = tuple(_uuid(f"trace-{self.id}-{k}") for k in range(len(bodies)))
        self._pad = 0  # characters of filler text; set by the maker with ``size``
        self.size = 0

    def __repr__(self) -> str:
        return f"Episode(id={self.id!r}, size={self.size}, traces={len(self.bodies)})"

    def to_record(self, *, fresh: bool = False) -> dict[str, Any]:
        """The JSON-ready record (what a monitor encodes), built on each call.

        Its traces hold the maker's shared bodies, so do not change them.

        :param fresh: return a copy sharing no ``str``, list or dict with anything else (only
            numbers, which orjson caches nothing in): what a benchmark must encode.
        """
        record = self._maker._record(self, skeleton=False)
        return _fresh(record) if fresh else record


class EpisodeMaker:
    """Makes seeded, production-like ``Episode`` objects that share ``BODIES`` trace bodies.

    ::

        maker = EpisodeMaker(seed=0)
        episodes = maker.episodes(1_000)                   # production sizes
        episodes = maker.episodes(10_000, size=2_200_000)  # all about 2.2 MB

    An episode of ``target`` bytes holds bodies picked (seeded) among the three largest that
    still fit, until less than the smallest is left; filler text in its first trace makes up
    the rest, so its size is within ~2% of the target (almost always exact). Bodies are built
    on first use (~0.1 s per 10 MB) and kept: ~130 MB of memory when all 24 are.

    :param seed: the seed of every episode, body and text it makes.
    """

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        ratio: float = (_LARGEST_BODY / _SMALLEST_BODY) ** (1 / (BODIES - 1))
        #: The size each body is built for; ``body_size`` is what it really encodes to. Plans
        #: use these, never a measured size, so planning builds only the bodies it picks.
        self.targets: list[int] = [round(_SMALLEST_BODY * ratio**i) for i in range(BODIES)]
        self.model = _MODELS[seed % len(_MODELS)]
        self.run_id = _uuid(f"run-{seed}")
        self._bodies: dict[int, dict[str, Any]] = {}
        self._stats: dict[int, _Stats] = {}
        self._sizes: dict[int, int] = {}
        self._bytes: dict[int, bytes] = {}
        self._text: _Text | None = None

    # -- bodies -------------------------------------------------------------------------

    def body(self, i: int) -> dict[str, Any]:
        """Body ``i`` (0 is the smallest): the ``tools``, ``nodes`` and ``calls`` of every
        trace that holds it, built the first time it is asked for.

        :param i: the body's number, ``0 <= i < BODIES``.
        """
        body = self._bodies.get(i)
        if body is None:
            text = self.text()
            target = self.targets[i]
            body, stats, fixed = _build_body(target, i, self.seed, text, model=self.model)
            size = _body_size(body)
            if abs(size - target) > _BODY_TOLERANCE * target:  # same shape, rescaled
                scale = (target - fixed) / (size - fixed)
                del body  # before building its successor: memory peaks lower
                body, stats, _ = _build_body(
                    target, i, self.seed, text, model=self.model, scale=scale
                )
                size = _body_size(body)
            self._bodies[i] = body
            self._stats[i] = stats
            self._sizes[i] = size
        return body

    def body_size(self, i: int) -> int:
        """``len(body_bytes(i))``, measured when the body is built.

        :param i: the body's number.
        """
        self.body(i)
        return self._sizes[i]

    def body_bytes(self, i: int) -> bytes:
        """Body ``i``'s JSON as it appears in a trace (``"tools":[...],"nodes":[...],
        "calls":[...]``), kept once made: only checking records read back needs it (all 24
        bodies hold ~100 MB of JSON, which a run itself never holds).

        :param i: the body's number.
        """
        data = self._bytes.get(i)
        if data is None:
            data = self._bytes[i] = orjson.dumps(self.body(i))[1:-1]
        return data

    def forget_bytes(self) -> None:
        """Drop the bytes ``body_bytes`` kept."""
        self._bytes.clear()

    def text(self) -> _Text:
        """The maker's text and token pools, made on first use."""
        if self._text is None:
            self._text = _Text(self.seed)
        return self._text

    # -- episodes -----------------------------------------------------------------------

    def episode(self, target_bytes: int, *, index: int) -> Episode:
        """Episode number ``index`` of about ``target_bytes`` of JSON (at least ``MIN_BYTES``).

        The ids depend on the seed, the index and the target only: episodes of different
        indexes (or targets) never share an episode or trace id.

        :param target_bytes: the size to make it, in bytes of JSON.
        :param index: its number, which its ids and content derive from.
        """
        if target_bytes < MIN_BYTES:
            raise ValueError(f"target_bytes must be at least {MIN_BYTES}, not {target_bytes}")
        rng = random.Random(f"episode-{self.seed}-{index}-{target_bytes}")
        left = target_bytes - _ENVELOPE_BYTES
        picked: list[int] = []
        while fits := bisect.bisect_right(self.targets, left - _TRACE_BYTES):
            i = rng.choice(range(max(0, fits - 3), fits))  # one of the three largest that fit
            picked.append(i)
            left -= self.targets[i] + _TRACE_BYTES
        if not picked:
            picked.append(0)
        rng.shuffle(picked)
        episode = Episode(self, index=index, target=target_bytes, bodies=tuple(picked))
        skeleton = len(orjson.dumps(self._record(episode, skeleton=True)))
        size = skeleton + sum(self.body_size(i) - len(_MARKER) for i in picked)
        episode._pad = max(0, target_bytes - size)  # plain text: one byte per character
        episode.size = size + episode._pad
        return episode

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
        by ``lognormal_sizes`` (production's by default).

        :param n: how many episodes.
        :param size: every episode's target size; None draws the sizes.
        :param median: the drawn sizes' median.
        :param p90: their 90th percentile.
        :param cap: the largest drawn size.
        :param start: the first episode's index.
        """
        if size is not None:
            sizes = [size] * n
        else:
            sizes = lognormal_sizes(n, seed=self.seed, median=median, p90=p90, cap=cap)
        return [self.episode(s, index=start + k) for k, s in enumerate(sizes)]

    # -- checking what was written ------------------------------------------------------

    def expected_pieces(self, episode: Episode) -> Iterator[bytes]:
        """The bytes of ``orjson.dumps(episode.to_record())``, in pieces (the per-episode
        fields around each body, and each body's ``body_bytes``), without building the line.

        :param episode: an episode this maker made.
        """
        skeleton = orjson.dumps(self._record(episode, skeleton=True))
        around = skeleton.split(_MARKER)
        if len(around) != len(episode.bodies) + 1:
            raise AssertionError(f"{episode!r}: {len(around) - 1} bodies in the skeleton")
        yield around[0]
        for i, after in zip(episode.bodies, around[1:], strict=True):
            yield self.body_bytes(i)
            yield after

    def matches(self, line: bytes | bytearray | memoryview, episode: Episode) -> str | None:
        """None if ``line`` (without its newline) is exactly ``orjson.dumps`` of the
        episode's record, else what differs. Compares bytes piece by piece (memcmp speed).

        :param line: the bytes read back.
        :param episode: the episode they should hold.
        """
        view = memoryview(line)
        if len(view) != episode.size:
            return f"{len(view)} bytes, expected {episode.size}"
        at = 0
        for piece in self.expected_pieces(episode):
            if view[at : at + len(piece)] != piece:
                return f"bytes {at}..{at + len(piece)} differ"
            at += len(piece)
        return None

    # -- the record ---------------------------------------------------------------------

    def _record(self, episode: Episode, *, skeleton: bool) -> dict[str, Any]:
        """The episode's record, its fields drawn afresh from its id; ``skeleton`` leaves
        every trace's body empty (``_MARKER``)."""
        rng = random.Random(episode.id)
        text = self.text()
        i = episode.index
        step = i // 256  # a training step logs a few hundred episodes
        env = _ENVS[i % len(_ENVS)]
        example = rng.randrange(100_000)
        prompt = text.take(rng, rng.choice(("ascii", "ascii", "bmp")), rng.uniform(150, 600))
        data = {
            "idx": example,
            "prompt": prompt,
            "skills": [],
            "network_allow": ["*"],
            "network_block": [],
            "artifacts": [],
            "artifact_max_bytes": 33_554_432,
            "timeout": {},
            "resources": {},
            "answer": str(rng.randrange(10_000)),
            "difficulty": rng.choice(("easy", "medium", "hard")),
        }
        digest = hashlib.sha256(f"{env}/{example}".encode()).hexdigest()
        task = {"type": "Task", "data": data, "key": digest, "hash": digest}
        config = {
            "runtime": {
                "allow": ["*"],
                "block": [],
                "type": "prime",
                "image": "python:3.11-slim",
                "labels": [],
                "cpu": 1.0,
                "memory": 2.0,
                "disk": 5.0,
                "idle_timeout": 3600.0,
            },
            "model": self.model,
            "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 8192},
            "max_turns": 64,
            "timeout": {},
            "retries": {"max_retries": 0, "rules": []},
            "network_notice": True,
        }
        start = _EPOCH + 3600.0 * step + rng.uniform(0, 3000)
        traces: list[dict[str, Any]] = []
        ok = True
        for k, (b, trace_id) in enumerate(zip(episode.bodies, episode.trace_ids, strict=True)):
            stats = self._stats_of(b)
            failed = rng.random() < 0.03
            ok = ok and not failed
            errors = [_error(rng)] if failed else []
            correct = 0.0 if failed else float(rng.random() < 0.5)
            body = {"tools": [], "nodes": [], "calls": []} if skeleton else self.body(b)
            # The filler draws from its own generator: the other fields never depend on it.
            info = {"feedback": text.plain(random.Random(trace_id), episode._pad)} if k == 0 else {}
            traces.append(
                {
                    "version": 1,
                    "id": trace_id,
                    "verifiers": {"version": _VERIFIERS},
                    "task": task,
                    "agent": {
                        "config": config,
                        "name": _AGENTS[k % len(_AGENTS)] + (f"_{k}" if k >= len(_AGENTS) else ""),
                        "trainable": True,
                    },
                    "tools": body["tools"],
                    "nodes": body["nodes"],
                    "calls": body["calls"],
                    "mm_token_type_id_map": {},
                    "request_rewrites": [],
                    "response_rewrites": [],
                    "rewards": {
                        "correct": {"score": correct, "weight": 1.0},
                        "format": {"score": round(rng.random(), 4), "weight": 0.1},
                    },
                    "metrics": {
                        "num_turns": float(stats.turns),
                        "num_tool_calls": float(stats.tool_calls),
                    },
                    "info": info,
                    "extra_usage": [],
                    "is_completed": True,
                    "ok": not failed,
                    "stop_condition": "tool_error" if failed else "agent_completed",
                    "is_timeout": False,
                    "errors": errors,
                    "timing": _timing(rng, start, stats.seconds),
                    "num_input_tokens": stats.input_tokens,
                    "num_output_tokens": stats.output_tokens,
                    "num_total_tokens": stats.input_tokens + stats.output_tokens,
                }
            )
        inputs = sum(self._stats_of(b).input_tokens for b in episode.bodies)
        outputs = sum(self._stats_of(b).output_tokens for b in episode.bodies)
        return {
            "id": episode.id,
            "env": {"id": env, "name": env.split("-")[0]},
            "task": task,
            "group": {"id": _uuid(f"group-{self.seed}-{step}-{example}")},
            "run": {
                "type": "train",
                "id": self.run_id,
                "name": f"nodewise-loadtest-{self.seed}",
                "work": {"type": "train", "step": step, "policy": {"start": step, "end": step}},
            },
            "ok": ok,
            "is_timeout": False,
            "errors": [],
            "traces": traces,
            "num_input_tokens": inputs,
            "num_output_tokens": outputs,
            "num_total_tokens": inputs + outputs,
        }

    def _stats_of(self, i: int) -> _Stats:
        self.body(i)
        return self._stats[i]


def _fresh(value: Any) -> Any:
    """A deep copy of a JSON-ready value in which every str, list and dict is a new object."""
    if isinstance(value, str):
        return value.encode().decode()  # a new str, without the UTF-8 copy orjson caches
    if isinstance(value, dict):
        return {_fresh(k): _fresh(v) for k, v in value.items()}
    if isinstance(value, list):
        try:
            sum(value)  # a per-token array, numbers only (~3 ns an element to check)
        except TypeError:
            return [_fresh(v) for v in value]
        return list(value)
    return value


def _uuid(name: str) -> str:
    """A version-4 UUID in hex (as verifiers makes ids), derived from ``name``."""
    digest = bytearray(hashlib.blake2b(name.encode(), digest_size=16).digest())
    digest[6] = digest[6] & 0x0F | 0x40  # version 4
    digest[8] = digest[8] & 0x3F | 0x80  # RFC 4122 variant
    return digest.hex()


def _error(rng: random.Random) -> dict[str, Any]:
    """A tool failure as verifiers records one, with a traceback to escape."""
    line = rng.randrange(10, 400)
    return {
        "type": "ToolError",
        "message": f"tool 'python' exited with status {rng.randrange(1, 3)}",
        "traceback": (
            "Traceback (most recent call last):\n"
            f'  File "C:\\work\\env\\tools.py", line {line}, in run\n'
            '    raise ToolError(f"tool {name!r} exited with status {code}")\n'
            "ToolError: tool 'python' exited with status 1\n"
        ),
    }


def _timing(rng: random.Random, start: float, seconds: float) -> dict[str, Any]:
    """A trace's ``timing``: boot, setup, the agent (model and harness time), finalize and
    scoring, one after another from ``start``."""
    spans: dict[str, Any] = {"start": start}
    t = start
    for name, length in (
        ("boot", rng.uniform(1, 20)),
        ("setup", rng.uniform(0.1, 5)),
        ("agent", seconds),
        ("finalize", rng.uniform(0.01, 1)),
        ("scoring", rng.uniform(0.01, 2)),
    ):
        span: dict[str, Any] = {"start": t, "end": t + length}
        if name == "agent":
            model = length * rng.uniform(0.6, 0.9)
            span["model"] = {"duration": model}
            span["harness"] = {"duration": length - model}
        spans[name] = span
        t += length + rng.uniform(0, 0.05)
    return spans


# -- building a body ----------------------------------------------------------------------


class _Stats(NamedTuple):
    """What a trace's fields say about the body it holds."""

    input_tokens: int  # fed in (prompt tokens beyond the previous call's sequence), summed
    output_tokens: int  # sampled, summed
    turns: int
    tool_calls: int
    seconds: float  # the agent's wall clock


class _Text:
    """Text pools (ASCII, with BMP characters, with emoji, and plain words) and token pools."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(f"text-{seed}")
        words = [*_ASCII_WORDS, *_ESCAPED]
        weights = [1.0] * len(_ASCII_WORDS) + [0.2] * len(_ESCAPED)
        self.pools: dict[str, str] = {}
        self.per_char: dict[str, float] = {}
        for kind, chars in _POOLS.items():
            vocab, w = list(words), list(weights)
            seps: tuple[str, ...] = _SEPARATORS
            if kind == "plain":
                vocab, w, seps = list(_ASCII_WORDS), [1.0] * len(_ASCII_WORDS), (" ",)
            if kind in ("bmp", "astral"):
                vocab += _BMP_WORDS
                w += [0.3] * len(_BMP_WORDS)
            if kind == "astral":
                vocab += _ASTRAL_WORDS
                w += [0.3] * len(_ASTRAL_WORDS)
            # Each word with the separator after it, drawn at once.
            pairs = [word + sep for word in vocab for sep in seps]
            pair_weights = [x for x in w for _ in seps]
            text = "".join(rng.choices(pairs, pair_weights, k=chars // 4))[:chars]
            self.pools[kind] = text
            sample = text[: 1 << 16]  # a copy: the pool itself never gets orjson's UTF-8 cache
            self.per_char[kind] = (len(orjson.dumps(sample)) - 2) / len(sample)
        self.token_ids = [rng.randrange(_VOCAB) for _ in range(_POOL_TOKENS)]
        # Rounded as records hold them (verifiers' float_decimals=4), one float object each.
        self.logprobs = [round(-rng.expovariate(3.0), 4) for _ in range(_POOL_TOKENS)]
        # JSON bytes per token of an input and of a sampled node's arrays (a comma each):
        # its id, mask and is_content ("false", mostly "true"); sampled, its logprob and
        # advantage (about as long) too.
        id_bytes = len(orjson.dumps(self.token_ids)) / _POOL_TOKENS
        logprob_bytes = len(orjson.dumps(self.logprobs)) / _POOL_TOKENS
        self.input_bytes = id_bytes + 6 + 5
        self.sampled_bytes = id_bytes + 5 + 5 + 2 * logprob_bytes

    def take(self, rng: random.Random, kind: str, nbytes: float) -> str:
        """About ``nbytes`` of JSON string content (at least a few characters), a new str."""
        return self._slice(rng, kind, max(8, round(nbytes / self.per_char[kind])))

    def plain(self, rng: random.Random, n: int) -> str:
        """Exactly ``n`` characters (and bytes of JSON) of plain words."""
        return self._slice(rng, "plain", n)

    def _slice(self, rng: random.Random, kind: str, n: int) -> str:
        pool = self.pools[kind]
        parts: list[str] = []
        while n > 0 or not parts:
            k = min(n, len(pool) - 1)  # never the whole pool: a slice is a new object
            at = rng.randrange(len(pool) - k)
            parts.append(pool[at : at + k])
            n -= k
        return parts[0] if len(parts) == 1 else "".join(parts)

    def tokens(
        self, rng: random.Random, n: int, *, logprobs: bool
    ) -> tuple[list[int], list[float]]:
        """``n`` token ids and, if asked, as many logprobs: slices of the pools (new lists,
        shared numbers)."""
        ids: list[int] = []
        lps: list[float] = []
        while len(ids) < n:
            k = min(n - len(ids), _POOL_TOKENS)
            at = rng.randrange(_POOL_TOKENS - k + 1)
            ids += self.token_ids[at : at + k]
            if logprobs:
                lps += self.logprobs[at : at + k]
        return ids, lps


def _body_size(body: dict[str, Any]) -> int:
    """``len(orjson.dumps(body)) - 2``, encoding a node or call at a time (not holding tens of
    MB of bytes at once)."""
    size = len(orjson.dumps({**body, "nodes": [], "calls": []})) - 2
    for key in ("nodes", "calls"):
        items = body[key]
        size += sum(len(orjson.dumps(item)) for item in items) + max(0, len(items) - 1)
    return size


def _tool_specs(names: list[str]) -> list[dict[str, Any]]:
    """The tools a trace's harness offers (as verifiers records them, on the root node too)."""
    parameters = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to run, read or look up"},
            "limit": {"type": "integer", "minimum": 1},
            "strict": {"type": "boolean"},
        },
        "required": ["query"],
    }
    return [
        {
            "type": "function",
            "name": name,
            "description": f"Run {name} in the task's sandbox and return its output.",
            "parameters": parameters,
        }
        for name in names
    ]


def _build_body(
    target: int, number: int, seed: int, text: _Text, *, model: str, scale: float = 1.0
) -> tuple[dict[str, Any], _Stats, int]:
    """One trace's body: a conversation (a chain of message nodes) and its model calls, whose
    JSON is about ``target`` bytes; ``scale`` multiplies the text and tokens only, leaving the
    conversation's shape as is. Also its statistics, and its estimated bytes that do not
    scale."""
    rng = random.Random(f"body-{seed}-{number}")  # the shape
    at = random.Random(f"offsets-{seed}-{number}")  # where text and tokens are sliced from
    kinds, kind_w = list(_POOL_WEIGHTS), list(_POOL_WEIGHTS.values())
    turns = 1 + int(math.sqrt(target) / 90) + rng.randint(0, 3)
    # (role, text pool, content weight, reasoning weight, tool calls' argument weights)
    plan: list[tuple[str, str, float, float, list[float]]] = [
        ("system", "ascii", 0.5 * rng.lognormvariate(0, 0.4), 0.0, []),
        ("user", rng.choices(kinds, kind_w)[0], rng.lognormvariate(-0.5, 0.8), 0.0, []),
    ]
    for turn in range(turns):
        kind = rng.choices(kinds, kind_w)[0]
        last = turn == turns - 1
        calls = (
            [] if last else [rng.lognormvariate(-2.5, 0.7) for _ in range(rng.choice((0, 1, 1, 2)))]
        )
        plan.append(
            ("assistant", kind, rng.lognormvariate(-0.3, 0.9), rng.lognormvariate(0.3, 0.9), calls)
        )
        for _ in calls:
            plan.append(
                ("tool", rng.choices(kinds, kind_w)[0], rng.lognormvariate(0.4, 1.1), 0, [])
            )
        if not calls and not last:
            plan.append(("user", kind, rng.lognormvariate(-0.6, 0.8), 0.0, []))
    offered = rng.sample(_TOOLS, min(len(_TOOLS), 2 + turns // 8))
    tools = _tool_specs(offered)
    # What does not grow with the text: the tools (twice), each node's and call's fields.
    fixed = 2 * len(orjson.dumps(tools)) + _NODE_BYTES * len(plan) + _CALL_BYTES * turns
    # JSON bytes of text per unit of weight, such that text and tokens (which follow the
    # text, at the per-token cost of their node's arrays) fill what is not fixed.
    per_text = {
        "assistant": 1 + text.sampled_bytes / _TEXT_BYTES_PER_TOKEN,
        "other": 1 + text.input_bytes / _TEXT_BYTES_PER_TOKEN,
    }
    total = sum(
        (c + r + sum(a)) * per_text["assistant" if role == "assistant" else "other"]
        for role, _, c, r, a in plan
    )
    per_weight = max(target - fixed, target / 4) * scale / total
    advantage = round(rng.gauss(0.0, 0.5), 4)  # one per trace, as group-relative RL assigns it
    nodes: list[dict[str, Any]] = []
    calls_out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (call id, tool name) awaiting their tool message
    clock = _EPOCH + rng.uniform(0, 86_400)
    path = inputs = outputs = previous = tool_calls = 0  # token counts along the chain
    for n, (role, kind, content, reasoning, call_weights) in enumerate(plan):
        node: dict[str, Any] = {"parent": n - 1} if n else {"tools": tools}
        node["semantic_parents"] = []
        if role != "assistant":
            message: dict[str, Any] = {"role": role}
            if role == "tool":  # the answer to the oldest call still open
                call_id, name = pending.pop(0)
                message["tool_call_id"] = call_id
            message["content"] = text.take(at, kind, content * per_weight)
            if role == "tool":
                message["name"] = name
            body = max(1, round(content * per_weight / _TEXT_BYTES_PER_TOKEN))
            ids, _ = text.tokens(at, _LEAD + body + _TAIL, logprobs=False)
            clock += rng.uniform(0.01, 3.0)
            node["message"] = message
            node["sampled"] = False
            node["timestamp"] = clock
            node["token_ids"] = ids
            node["mask"] = [False] * len(ids)
            node["is_content"] = [False] * _LEAD + [True] * body + [False] * _TAIL
            node["logprobs"] = []
            path += len(ids)
            nodes.append(node)
            continue
        message = {
            "role": "assistant",
            "content": text.take(at, kind, content * per_weight),
            "reasoning_content": text.take(at, kind, reasoning * per_weight),
        }
        if call_weights:
            message["tool_calls"] = []
            for weight in call_weights:
                call_id, name = f"call_{rng.getrandbits(64):016x}", rng.choice(offered)
                arguments = {
                    "query": text.take(at, kind, weight * per_weight),
                    "limit": rng.randint(1, 50),
                    "strict": rng.random() < 0.5,
                }
                message["tool_calls"].append(
                    {
                        "id": call_id,
                        "type": "function",
                        "name": name,
                        "arguments": orjson.dumps(arguments).decode(),
                    }
                )
                pending.append((call_id, name))
            tool_calls += len(call_weights)
        weight = content + reasoning + sum(call_weights)
        sampled = max(1, round(weight * per_weight / _TEXT_BYTES_PER_TOKEN)) + 1  # + end of turn
        ids, logprobs = text.tokens(at, _LEAD + sampled, logprobs=True)
        # The generation prompt's scaffold, then the sampled tokens (the content).
        mask = [False] * _LEAD + [True] * sampled
        seconds = sampled / rng.uniform(40, 120)
        clock += seconds
        node["message"] = message
        node["sampled"] = True
        node["timestamp"] = clock
        node["token_ids"] = ids
        node["mask"] = node["is_content"] = mask  # equal here: one list saves memory
        node["logprobs"] = logprobs[_LEAD:]
        node["advantages"] = [advantage] * sampled
        nodes.append(node)
        # The call that sampled it: the prompt is the chain so far plus the scaffold; the
        # engine's prefix cache holds the previous call's whole sequence.
        prompt = path + _LEAD
        usage: dict[str, Any] = {"prompt_tokens": prompt - previous, "completion_tokens": sampled}
        if previous:
            usage["cached_input_tokens"] = previous
        usage["reasoning_tokens"] = round(sampled * reasoning / weight)
        calls_out.append(
            {
                "node": n,
                "model": model,
                "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 8192},
                "endpoint": "/chat/completions",
                "finish_reason": "tool_calls" if call_weights else "stop",
                "usage": usage,
                "time": {"start": clock - seconds, "end": clock},
            }
        )
        inputs += prompt - previous
        outputs += sampled
        path += len(ids)
        previous = path
    seconds = clock - nodes[0]["timestamp"]
    stats = _Stats(inputs, outputs, len(calls_out), tool_calls, seconds)
    return {"tools": tools, "nodes": nodes, "calls": calls_out}, stats, fixed
