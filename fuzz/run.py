"""Run fuzz targets with their seed corpus: ``python fuzz/run.py [TARGET ...] [--seconds N]``.

Seeds are the committed cases under ``fuzz/corpus/<target>/`` plus, built at run time, the
documents of ``tests/corpus``. ``--seconds`` explores: new inputs the fuzzer finds go to
``fuzz/work/<target>/found`` (ignored by git, kept for the next run). ``--runs N`` replays:
N inputs from a fixed seed over the seeds alone, with a fresh output corpus, so that one
commit runs the same inputs on any machine (``make test``). A crashing input goes to
``<work>/<target>/crash-*``: fix the bug, then add that input to ``fuzz/corpus/<target>/``
as a regression case. Exits non-zero when a target crashes.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CORPUS = ROOT / "tests" / "corpus"
TARGETS = ("encode", "traces_reader", "traces_server")


def corpus_seeds(target: str, into: Path) -> Path:
    """The corpus's documents as seeds, written to the new directory ``into`` (the fuzzer
    reads inputs up to -max_len)."""
    into.mkdir(parents=True)
    if target == "encode":
        for path in sorted(CORPUS.glob("*.json.xz")):
            seed = into / path.name.removesuffix(".xz")
            seed.write_bytes(lzma.decompress(path.read_bytes()))
        blns = CORPUS / "blns.txt.xz"
        if blns.exists():
            lines = lzma.decompress(blns.read_bytes()).decode("utf-8", "replace").splitlines()
            strings = [s for s in lines if s and not s.startswith("#")]
            for i in range(0, len(strings), 64):
                part = json.dumps(strings[i : i + 64], ensure_ascii=False)
                (into / f"blns-{i // 64}").write_bytes(part.encode("utf-8", "surrogatepass"))
    elif target == "traces_reader":
        # Real records as NDJSON lines (the fuzzer keeps them whole, cuts or garbles them).
        github = CORPUS / "github.json.xz"
        seed = into / "github.ndjson"
        if github.exists():
            events = json.loads(lzma.decompress(github.read_bytes()))
            seed.write_bytes(b"".join(json.dumps(e).encode() + b"\n" for e in events[:8]))
    return into


def seed_list(target: str, scratch: Path) -> Path:
    """Every seed, in one fixed order, as a ``-seed_inputs=@file`` list.

    libFuzzer runs its seeds in the order it gets them (shuffled by -seed, then sorted by
    size), and a directory lists its files in an order that depends on the file system, so
    seeds of equal size would run, and join the corpus, in a different order elsewhere. The
    list names copies (``seeds/0000`` ...), relative to ``scratch`` (the target's working
    directory): -seed_inputs separates paths with commas, which a checkout path may hold.
    """
    generated = corpus_seeds(target, scratch / "generated")
    files = sorted((HERE / "corpus" / target).iterdir()) + sorted(generated.iterdir())
    seeds = scratch / "seeds"
    seeds.mkdir()
    names = []
    for n, path in enumerate(f for f in files if f.is_file() and f.stat().st_size):
        shutil.copyfile(path, seeds / f"{n:04d}")
        names.append(f"seeds/{n:04d}")
    listing = scratch / "seeds.txt"
    listing.write_text(",".join(names))
    return listing


def target_env() -> dict[str, str]:
    """The target's environment: only what it needs, so that none of the caller's settings
    (PYTHONOPTIMIZE strips the targets' asserts, AIOHTTP_NO_EXTENSIONS swaps aiohttp's
    parser, ...) changes what runs, and a fixed hash seed, so that set and dict orders
    built from str hashes are the same in every run."""
    env = {"PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0", "PYTHONUTF8": "1"}
    for name in ("PATH", "HOME", "TMPDIR", "SYSTEMROOT"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def run(
    target: str,
    *,
    seconds: int | None = None,
    runs: int | None = None,
    seed: int | None = None,
    work: Path = HERE / "work",
) -> int:
    """One target for ``seconds`` (output corpus ``<work>/<target>/found``, kept) or for
    ``runs`` inputs (a fresh output corpus, dropped after)."""
    artifacts = work / target
    artifacts.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{target}-") as tmp:
        scratch = Path(tmp)
        if runs is None:
            found = artifacts / "found"
            found.mkdir(exist_ok=True)
            limit = f"-max_total_time={seconds}"
            what = f"{seconds} s"
        else:
            found = scratch / "found"
            found.mkdir()
            # Atheris's count of inputs: it exits through Python (sys.exit), so the
            # targets' cleanup runs, where libFuzzer's -runs ends the process in C.
            limit = f"-atheris_runs={runs}"
            what = f"{runs} inputs"
        command = [
            sys.executable,
            str(HERE / f"{target}.py"),
            limit,
            # Far from what a machine's speed decides: the slowest input of a test run takes
            # 0.13 s here (encode), the largest peak RSS is 170 MB (encode).
            "-timeout=30",
            "-rss_limit_mb=4096",
            "-max_len=1000000",
            # No rereading of the output corpus each second: it ran the inputs it had just
            # written again, a count of runs that depends on the machine's speed.
            "-reload=0",
            f"-artifact_prefix={artifacts}/",
            f"-seed_inputs=@{seed_list(target, scratch).name}",
            *([f"-seed={seed}"] if seed is not None else []),
            str(found),
        ]
        print(f"fuzz {target}: {what}", flush=True)
        done = subprocess.run(command, cwd=scratch, env=target_env(), check=False)
        return done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("targets", nargs="*", help=f"of {', '.join(TARGETS)} (default: all)")
    default = int(os.environ.get("FUZZ_SECONDS", "60"))
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=int, default=default, help="per target (FUZZ_SECONDS)")
    budget.add_argument("--runs", type=int, help="inputs per target, instead of a time limit")
    parser.add_argument("--seed", type=int, help="libFuzzer's seed (default: a new one each run)")
    parser.add_argument(
        "--work", type=Path, default=HERE / "work", help="for <target>/crash-* (and found/)"
    )
    args = parser.parse_args()
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    if args.runs is not None and args.seed is None:
        parser.error("--runs needs --seed: a fixed count of inputs is only repeatable from one")
    failed = [
        t
        for t in args.targets or TARGETS
        if run(t, seconds=args.seconds, runs=args.runs, seed=args.seed, work=args.work.resolve())
        != 0
    ]
    if failed:
        where = args.work / "<target>"
        sys.exit(f"fuzz targets crashed: {', '.join(failed)} (inputs in {where}/)")


if __name__ == "__main__":
    main()
