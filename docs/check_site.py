"""Open the built site in headless Chromium and screenshot it, so a broken render is seen.

    python docs/check_site.py [--site site] [--out site-check]   (``make docs-check``)

Serves ``site/`` on 127.0.0.1 (``http.server``, in a thread of this process) and, for the home
page, the design page (its diagrams are SVG files) and the benchmark page: saves a
screenshot to ``site-check/<page>.png``, and dumps the DOM after scripts ran. Fails (exit 1)
when a page's title or heading is not the expected one, when the screenshot is blank (a
render that failed is one flat colour), when a request the browser made was answered with
an error, or when an image of the page was never fetched.
Chromium is Debian's ``chromium`` package (``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import functools
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Page:
    name: str
    path: str
    title: str  # the <title> starts with this
    heading: str  # an <h1> holds this text
    height: int  # screenshot height in pixels


PAGES = [
    Page("home", "/", "nodewise", "nodewise", 1600),
    Page("design", "/design/", "Design - nodewise", "Design", 3000),
    Page("benchmarks", "/benchmarks/", "Benchmarks - nodewise", "Benchmarks", 6400),
]


class _Handler(SimpleHTTPRequestHandler):
    """Serves the site and records every request as (path, status)."""

    requests: list[tuple[str, int]]

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        self.requests.append((self.path, int(code)))

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the check prints its own summary


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("docs-check: Chromium not found; install it with `apt-get install -y chromium`")


def chromium(binary: str, profile: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        binary,
        "--headless",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-extensions",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",  # let scripts and images finish before capturing
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def distinct_colours(png: Path) -> int:
    with Image.open(png) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    return 1 << 16 if colours is None else len(colours)


def check_page(
    page: Page, base: str, binary: str, out: Path, requests: list[tuple[str, int]]
) -> list[str]:
    problems: list[str] = []
    url = base + page.path
    shot = out / f"{page.name}.png"
    shot.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="docs-check-") as profile:
        requests.clear()
        run = chromium(
            binary, profile, f"--window-size=1280,{page.height}", f"--screenshot={shot}", url
        )
        fetched = list(requests)
        dom = chromium(binary, profile, "--dump-dom", url).stdout
    if not shot.exists():
        return [f"{page.name}: no screenshot ({run.stderr.strip()[-300:]})"]
    colours = distinct_colours(shot)
    if colours < 64:
        problems.append(f"{page.name}: the screenshot is blank ({colours} colours)")
    title = re.search(r"<title>(.*?)</title>", dom, re.S)
    if title is None or not title.group(1).strip().startswith(page.title):
        problems.append(f"{page.name}: title is {title and title.group(1)!r}, not {page.title!r}")
    headings = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<h1[^>]*>(.*?)</h1>", dom, re.S)]
    if not any(page.heading in h for h in headings):
        problems.append(f"{page.name}: no <h1> with {page.heading!r} (found {headings})")
    failed = sorted({f"{path} ({status})" for path, status in fetched if status >= 400})
    if failed:
        problems.append(f"{page.name}: requests failed: {', '.join(failed)}")
    images = set(re.findall(r'<img[^>]+src="([^"]+\.(?:png|svg))"', dom))
    paths = {path.split("?")[0] for path, status in fetched if status < 400}
    for src in sorted(images):
        wanted = re.sub(r"[^/]+/\.\./", "", page.path + src)  # "../img/x.png" from a page dir
        if wanted not in paths:
            problems.append(f"{page.name}: image {src} was never fetched")
    print(
        f"{page.name}: {shot.relative_to(ROOT) if shot.is_relative_to(ROOT) else shot} "
        f"({shot.stat().st_size // 1024} KiB, {colours} colours, {len(images)} images, "
        f"{len(fetched)} requests)"
    )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python docs/check_site.py", description=__doc__)
    parser.add_argument("--site", type=Path, default=ROOT / "site")
    parser.add_argument("--out", type=Path, default=ROOT / "site-check")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").exists():
        sys.exit(f"docs-check: {args.site} holds no built site; run `make docs` first")
    binary = find_chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    requests: list[tuple[str, int]] = []
    handler = functools.partial(
        type("Handler", (_Handler,), {"requests": requests}), directory=str(args.site)
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    problems: list[str] = []
    try:
        for page in PAGES:
            problems += check_page(page, base, binary, args.out, requests)
    finally:
        server.shutdown()
        server.server_close()
    for problem in problems:
        print(f"problem: {problem}")
    print(f"docs-check: {len(PAGES)} pages, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
