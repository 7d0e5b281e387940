"""The one error the encoder raises, and the JSON paths it carries."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["EncodeError", "format_path"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class EncodeError(TypeError):
    """A value could not be encoded; ``path`` names the node, e.g. ``$.traces[3].content``.

    A subclass of ``TypeError``, as ``orjson.JSONEncodeError`` is, so code written for orjson
    keeps catching it.

    :param message: What is wrong, as orjson words it where orjson would raise too.
    :param path: The JSON path of the node, ``$`` for the document itself.
    """

    def __init__(self, message: str, *, path: str = "$") -> None:
        super().__init__(f"{message} at {path}")
        self.message = message
        self.path = path


def format_path(parts: Iterable[tuple[bool, object]]) -> str:
    """Render a node's location from ``(is_key, key_or_index)`` steps.

    Indices print as ``[3]``, str keys as ``.name`` or ``["odd key"]``, other keys (allowed by
    ``OPT_NON_STR_KEYS``) as ``[<repr>]``.
    """
    out = ["$"]
    for is_key, part in parts:
        if not is_key:
            out.append(f"[{part}]")
        elif isinstance(part, str):
            if _IDENTIFIER.match(part):
                out.append(f".{part}")
            else:
                escaped = part.replace("\\", "\\\\").replace('"', '\\"')
                if len(escaped) > 60:
                    escaped = escaped[:57] + "..."
                out.append(f'["{escaped}"]')
        else:
            out.append(f"[{part!r}]")
    return "".join(out)
