"""Run fuzz targets with their seed corpus: ``python fuzz/run.py [TARGET ...] [--seconds N]``.

Seeds are the committed cases under ``fuzz/corpus/<target>/`` plus, built at run time, the
documents of ``tests/corpus``. New inputs the fuzzer finds go
to ``fuzz/work/<target>/`` (ignored by git) and a crashing input to
``fuzz/work/<target>/crash-*``: fix the bug, then add that input to ``fuzz/corpus/<target>/``
as a regression case. Exits non-zero when a target crashes.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CORPUS = ROOT / "tests" / "corpus"
TARGETS = ("encode", "traces_reader", "traces_server")


def corpus_seeds(target: str, into: Path) -> Path:
    """The corpus's documents as seeds (the fuzzer reads inputs up to -max_len)."""
    into.mkdir(parents=True, exist_ok=True)
    if target == "encode":
        for path in sorted(CORPUS.glob("*.json.xz")):
            seed = into / path.name.removesuffix(".xz")
            if not seed.exists():
                seed.write_bytes(lzma.decompress(path.read_bytes()))
        blns = CORPUS / "blns.txt.xz"
        if blns.exists() and not (into / "blns-0").exists():
            lines = lzma.decompress(blns.read_bytes()).decode("utf-8", "replace").splitlines()
            strings = [s for s in lines if s and not s.startswith("#")]
            for i in range(0, len(strings), 64):
                part = json.dumps(strings[i : i + 64], ensure_ascii=False)
                (into / f"blns-{i // 64}").write_bytes(part.encode("utf-8", "surrogatepass"))
    elif target == "traces_reader":
        # Real records as NDJSON lines (the fuzzer keeps them whole, cuts or garbles them).
        github = CORPUS / "github.json.xz"
        seed = into / "github.ndjson"
        if github.exists() and not seed.exists():
            events = json.loads(lzma.decompress(github.read_bytes()))
            seed.write_bytes(b"".join(json.dumps(e).encode() + b"\n" for e in events[:8]))
    return into


def run(target: str, seconds: int, seed: int | None = None) -> int:
    work = HERE / "work" / target
    new = work / "found"
    new.mkdir(parents=True, exist_ok=True)
    seeds = corpus_seeds(target, work / "corpus")
    command = [
        sys.executable,
        str(HERE / f"{target}.py"),
        f"-max_total_time={seconds}",
        "-timeout=30",
        "-rss_limit_mb=4096",
        "-max_len=1000000",
        f"-artifact_prefix={work}/",
        *([f"-seed={seed}"] if seed is not None else []),
        str(new),
        str(HERE / "corpus" / target),
        str(seeds),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(f"fuzz {target}: {seconds} s", flush=True)
    return subprocess.run(command, env=env, check=False).returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("targets", nargs="*", help=f"of {', '.join(TARGETS)} (default: all)")
    default = int(os.environ.get("FUZZ_SECONDS", "60"))
    parser.add_argument("--seconds", type=int, default=default, help="per target (FUZZ_SECONDS)")
    parser.add_argument("--seed", type=int, help="libFuzzer's seed (default: a new one each run)")
    args = parser.parse_args()
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    failed = [t for t in args.targets or TARGETS if run(t, args.seconds, args.seed) != 0]
    if failed:
        sys.exit(f"fuzz targets crashed: {', '.join(failed)} (inputs in fuzz/work/<target>/)")


if __name__ == "__main__":
    main()
