"""The README cannot drift: every code block in it runs here, in order, as a reader would run
it (the Prime monitor against a real local TracesServer, W&B offline), and the wheel that
its install step builds holds only the product."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from importlib.metadata import metadata
from pathlib import Path

import pytest

from monitors.testing import TracesServer

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
_BLOCK = re.compile(r"^```(?P<lang>\w+)\n(?P<code>.*?)^```$", re.M | re.S)
#: The README stays a user's guide, not a report.
MAX_LINES = 160


def blocks(lang: str) -> list[str]:
    return [m["code"] for m in _BLOCK.finditer(README.read_text()) if m["lang"] == lang]


def commands() -> list[str]:
    """Every command of the README's shell blocks, without its comment."""
    return [
        line.split("  #")[0].strip()
        for code in blocks("sh")
        for line in code.splitlines()
        if line.strip()
    ]


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The README's Python blocks run once, in order, as a reader trying it would run them:
    in a fresh working directory, the Prime settings pointing at a local TracesServer and
    wandb offline under it. Yields that directory and what the blocks printed; the
    environment stays for the module's tests of the commands that read what they wrote."""
    root = tmp_path_factory.mktemp("readme")
    with pytest.MonkeyPatch.context() as mp, TracesServer(api_key="readme-key") as server:
        mp.chdir(root)
        for name, value in {
            "WANDB_MODE": "offline",
            "WANDB_DIR": str(root),
            "WANDB_SILENT": "true",
            "PRIME_API_KEY": "readme-key",
            "PRIME_TRACES_URL": server.url,
            "PRIME_API_BASE_URL": server.url,
            "PRIME_TEAM_ID": "",
        }.items():
            mp.setenv(name, value)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            for code in blocks("python"):
                exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
        yield root, out.getvalue()


def test_the_readme_is_short_and_in_the_order_a_user_reads() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == [
        "Install",
        "Two commands",
        "The encoder",
        "The monitors, in an orchestrator",
        "Reading trace files back",
        "Results",
        "Documentation",
        "Development",
    ]
    assert "RESULTS_" not in text  # the placeholders were filled in


def test_every_python_block_runs_in_order(readme_run: tuple[Path, str]) -> None:
    in_tmp, printed = readme_run
    # The encoder's files, both ways.
    assert (in_tmp / "episode.json").read_bytes() == (in_tmp / "episode-async.json").read_bytes()
    # Three steps of four episodes, delivered by every monitor.
    for name in ("FileMonitor", "PrimeMonitor", "WandbMonitor"):
        assert f"'{name}': DeliveryStats(submitted=12, delivered=12, lost={{}})" in printed
    assert printed.rstrip().endswith("12 records; the last: " + _last_id(in_tmp))


def _last_id(root: Path) -> str:
    from monitors.traces import read_record

    # FileMonitor("runs/42") keeps every episode in one stream (prime-rl's run layout):
    # runs/42/monitors/file/traces/stream, which the readers find from the run's directory.
    return str(read_record(root / "runs/42", -1)["id"])


def test_every_nodewise_command_runs(readme_run: tuple[Path, str]) -> None:
    in_tmp, _ = readme_run  # with the trace files the commands read
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    ran = 0
    for command in commands():
        if not command.startswith("nodewise "):
            continue
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=in_tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
        ran += 1
    assert ran >= 4
    assert (in_tmp / "episodes.jsonl").read_bytes().count(b"\n") == 12


def test_the_monitors_example_without_a_key_or_wandb_keeps_its_books(tmp_path: Path) -> None:
    """The monitors example as a new user first runs it, with no Prime key and no wandb
    installed: the two start errors, each said once more with its count at finalize, then
    the example's summary, in which every monitor's stats balance; no traceback."""
    (example,) = [code for code in blocks("python") if "Monitors(" in code]
    script = "import sys\nsys.modules['wandb'] = None  # not installed\n" + example
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "WANDB_"))}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={**env, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    said = done.stderr.splitlines()
    assert [line.split(" (")[0] for line in said] == [
        "PrimeMonitor did not start",
        "WandbMonitor did not start",
        "WandbMonitor never started",
        "PrimeMonitor never started",
    ], done.stderr
    assert "PRIME_API_KEY" in said[0]
    assert "pip install wandb" in said[1]
    assert "12 episodes, 3 metrics posts lost as 'start_failed'" in said[3]
    from monitors import DeliveryStats

    stats = eval(done.stdout, {"DeliveryStats": DeliveryStats})
    assert stats == {
        "FileMonitor": DeliveryStats(12, 12, {}),
        "PrimeMonitor": DeliveryStats(12, 0, {"start_failed": 12}),
        "WandbMonitor": DeliveryStats(12, 0, {"start_failed": 12}),
    }


def test_every_make_target_and_extra_it_names_exists() -> None:
    named = [c.split()[1] for c in commands() if c.startswith("make ")]
    assert {"demo", "test", "check", "bench", "fuzz", "docs"} <= set(named)
    for target in named:
        subprocess.run(["make", "-n", target], cwd=ROOT, check=True, capture_output=True)
    extras = metadata("nodewise").get_all("Provides-Extra") or []
    for command in commands():
        if "pip install" in command:
            for extra in re.findall(r"\.\[(\w+)\]", command):
                assert extra in extras, command


def test_the_wheel_holds_only_the_product(tmp_path: Path) -> None:
    """``pip install .`` installs the encoder and the monitors: no benchmark, test or docs.
    (Built with uv, which ``make`` installs: the project's venv has no pip.)"""
    tools = ROOT / ".tools"
    uv = shutil.which("uv") or str(tools / "bin" / "uv")
    env = {**os.environ, "PYTHONPATH": str(tools)}
    subprocess.run(
        [uv, "build", "--wheel", "-q", "--out-dir", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
        env=env,
    )
    (wheel,) = tmp_path.glob("nodewise-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {n.split("/")[0] for n in names if not n.startswith("nodewise-")}
    assert packages == {"encoder", "monitors"}, sorted(names)
    assert "monitors/py.typed" in names
    assert "encoder/py.typed" in names
    web = ROOT / "monitors/traces/_browser/web"  # the trace browser's page, served as it is
    assert {f"monitors/traces/_browser/web/{p.name}" for p in web.iterdir()} <= set(names)
    assert not [n for n in names if "bench" in n or "witness" in n or "baseline" in n], names
    scripts = (
        zipfile.ZipFile(wheel)
        .read(next(n for n in names if n.endswith("entry_points.txt")))
        .decode()
    )
    assert shlex.split(scripts.split("[console_scripts]")[1].strip()) == [
        "nodewise",
        "=",
        "monitors.loadtest.cli:nodewise",
    ]
