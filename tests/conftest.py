"""Hypothesis profiles and the benchmark corpus (``tests/corpus``)."""

from __future__ import annotations

import lzma
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, settings

from monitors.testing import WANDB_CREDENTIALS, wandb_offline_env

# Values here are built large on purpose (long strings, big arrays, deep nesting).
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]

settings.register_profile("dev", max_examples=50, deadline=None, suppress_health_check=_SLOW_OK)
settings.register_profile(
    "ci", max_examples=200, deadline=None, print_blob=True, suppress_health_check=_SLOW_OK
)
settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=_SLOW_OK
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_configure(config: pytest.Config) -> None:
    # When a property fails with a large value, hypothesis warns that the value's repr is big
    # while it reports the failure; under ``filterwarnings = error`` that warning would replace
    # the real failure report. Everything else stays an error.
    config.addinivalue_line(
        "filterwarnings", "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
    )


@pytest.fixture(autouse=True)
def _fresh_wandb_session() -> Iterator[None]:
    """Ends wandb's session after each test that started one. wandb reads its environment
    once per process (``wandb.setup``) and ignores later changes, so without this every run
    would go where the first test's environment said (with no ``WANDB_DIR``: the working
    directory, that is the repository) instead of under the test's own ``tmp_path``."""
    yield
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """wandb offline, every file it writes under tmp_path, nothing sent anywhere; the folder
    its runs go to."""
    for name in WANDB_CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    env = wandb_offline_env(tmp_path / "wandb-home")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Path(env["WANDB_DIR"])


CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
JSON_FILES = ("twitter.json", "citm_catalog.json", "canada.json", "github.json")


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    """The corpus folder; a missing file is a failure, never a skip."""
    missing = [
        name
        for name in (*(f"{n}.xz" for n in JSON_FILES), "blns.txt.xz")
        if not (CORPUS_DIR / name).is_file()
    ]
    if missing:
        pytest.fail(
            f"the test corpus is incomplete: expected {', '.join(missing)} in {CORPUS_DIR}",
            pytrace=False,
        )
    return CORPUS_DIR


@pytest.fixture(scope="session")
def corpus_bytes(corpus_dir: Path) -> Callable[[str], bytes]:
    """``corpus_bytes("twitter.json")``: the raw JSON text of a corpus document."""
    cache: dict[str, bytes] = {}

    def read(name: str) -> bytes:
        if name not in cache:
            with lzma.open(corpus_dir / f"{name}.xz", "rb") as f:
                cache[name] = f.read()
        return cache[name]

    return read


@pytest.fixture
def load_corpus(corpus_bytes: Callable[[str], bytes]) -> Callable[[str], object]:
    """``load_corpus("twitter.json")``: a freshly parsed copy (new str objects on every call,
    so no UTF-8 cache left by an earlier encoding is shared)."""

    def load(name: str) -> object:
        return orjson.loads(corpus_bytes(name))

    return load


@pytest.fixture(scope="session")
def blns(corpus_dir: Path) -> list[str]:
    """The Big List of Naughty Strings: one per line, ``#`` lines and empty lines skipped."""
    with lzma.open(corpus_dir / "blns.txt.xz", "rt", encoding="utf-8", newline="\n") as f:
        lines = f.read().split("\n")
    strings = [line for line in lines if line and not line.startswith("#")]
    assert len(strings) > 400, f"blns.txt.xz looks truncated: {len(strings)} strings"
    return strings
