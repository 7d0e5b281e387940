"""mkdocs hooks (``hooks:`` in ``mkdocs.yml``): the benchmark page's plots and tables, made at
every build from the committed snapshots in ``docs/data/`` (``make docs-data`` refreshes them).

- ``on_files`` adds the plots of ``gen_plots.py`` to the site as ``img/<name>.png``.
- ``on_page_markdown`` replaces ``<!-- snapshot FILE "PREFIX" -->`` with the block of
  ``data/FILE`` (blocks are separated by blank lines) whose first line starts with PREFIX:
  the benchmark prints its tables and notes as one Markdown text, and the page places each.
  A missing file or block fails the build.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gen_plots  # beside this file: mkdocs puts the hook's directory on sys.path to load it

DATA = Path(__file__).resolve().parent / "data"
_SNAPSHOT = re.compile(r'<!-- snapshot (?P<file>[\w.-]+) "(?P<prefix>[^"]+)" -->')


def snapshot_block(name: str, prefix: str) -> str:
    """The blank-line-separated block of ``data/<name>`` that starts with ``prefix``."""
    blocks = re.split(r"\n\s*\n", (DATA / name).read_text())
    found = [b.strip("\n") for b in blocks if b.lstrip().startswith(prefix)]
    if len(found) != 1:
        raise ValueError(f"data/{name}: {len(found)} blocks start with {prefix!r}, not 1")
    return found[0]


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for name, png in gen_plots.render().items():
        files.append(File.generated(config, f"img/{name}", content=png))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return _SNAPSHOT.sub(lambda m: snapshot_block(m["file"], m["prefix"]), markdown)
