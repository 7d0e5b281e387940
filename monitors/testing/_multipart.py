"""A small push parser for ``multipart/form-data`` bodies, fed as the bytes arrive.

Why not aiohttp's ``MultipartReader``: the test server must see every part exactly as the
client framed it (raw header block, raw body bytes, no decoding of any kind) and must never
hold a big body twice, so the parser hands out each part's bytes in pieces as it goes, keeping
back only the few bytes that could be the start of the next boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "MultipartError",
    "MultipartParser",
    "PartData",
    "PartEnd",
    "PartStart",
    "parse_header_params",
]

_CRLF = b"\r\n"
_MAX_HEADER_BYTES = 16 << 10
_MAX_PREAMBLE_BYTES = 64 << 10
_TOKEN_CHARS = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


class MultipartError(ValueError):
    """The body is not well-formed ``multipart`` (the message says where)."""


@dataclass(frozen=True)
class PartStart:
    """A part begins. ``headers`` keep the client's order and spelling; names are matched
    case-insensitively with ``header()``."""

    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        for key, value in self.headers:
            if key.lower() == wanted:
                return value
        return None


@dataclass(frozen=True)
class PartData:
    """The next piece of the current part's body, exactly as sent."""

    data: bytes


@dataclass(frozen=True)
class PartEnd:
    """The current part's body is complete."""


Event = PartStart | PartData | PartEnd


class MultipartParser:
    """Feed body bytes with ``feed()``, get the events they complete; ``close()`` at the end
    of the body checks that the closing boundary was seen.

    Follows RFC 2046 section 5.1.1: the first boundary may open the body or follow a preamble,
    a boundary line may carry trailing spaces or tabs, anything after the closing boundary is
    an epilogue and ignored. Header lines must be ``Name: value`` (no obsolete line folding).
    """

    def __init__(self, boundary: str) -> None:
        if not 1 <= len(boundary) <= 70:
            raise MultipartError(f"boundary must be 1 to 70 characters, not {len(boundary)}")
        try:
            dash_boundary = b"--" + boundary.encode("ascii")
        except UnicodeEncodeError:
            raise MultipartError("boundary must be ASCII") from None
        self._dash = dash_boundary
        self._delimiter = _CRLF + dash_boundary
        self._buf = bytearray()
        self._state = "preamble"  # preamble | boundary | headers | body | done
        self.parts = 0

    @property
    def done(self) -> bool:
        """True once the closing boundary has been read."""
        return self._state == "done"

    def feed(self, data: bytes) -> list[Event]:
        if self._state == "done":
            return []  # epilogue
        self._buf += data
        events: list[Event] = []
        while self._step(events):
            pass
        return events

    def close(self) -> None:
        if self._state != "done":
            where = {
                "preamble": "before the first boundary",
                "boundary": "after a boundary",
                "headers": "in a part's headers",
                "body": "in a part's body",
            }[self._state]
            raise MultipartError(f"body ends {where}, without the closing boundary")

    def _step(self, events: list[Event]) -> bool:
        """Advance by one state change if the buffer allows; False when it needs more bytes."""
        buf = self._buf
        if self._state == "preamble":
            if buf.startswith(self._dash):
                del buf[: len(self._dash)]
            else:
                at = buf.find(self._delimiter)
                if at < 0:
                    if len(buf) > _MAX_PREAMBLE_BYTES:
                        raise MultipartError("no boundary in the first 64 KiB of the body")
                    return False
                del buf[: at + len(self._delimiter)]
            self._state = "boundary"
            return True
        if self._state == "boundary":
            if len(buf) < 2:
                return False
            if buf.startswith(b"--"):
                self._state = "done"
                buf.clear()
                return False
            end = buf.find(_CRLF)
            if end < 0:
                if len(buf) > 1024:
                    raise MultipartError("a boundary line does not end")
                return False
            if buf[:end].strip(b" \t"):
                raise MultipartError(f"unexpected bytes after a boundary: {bytes(buf[:end])!r}")
            del buf[: end + 2]
            self._state = "headers"
            return True
        if self._state == "headers":
            if buf.startswith(_CRLF):  # a part with no headers
                block = b""
                del buf[:2]
            else:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > _MAX_HEADER_BYTES:
                        raise MultipartError("a part's headers are over 16 KiB")
                    return False
                block = bytes(buf[:end])
                del buf[: end + 4]
            events.append(PartStart(_parse_headers(block)))
            self.parts += 1
            self._state = "body"
            return True
        if self._state == "body":
            at = buf.find(self._delimiter)
            if at < 0:
                # Keep back what could be the start of a delimiter split across feeds.
                keep = len(self._delimiter) - 1
                if len(buf) > keep:
                    events.append(PartData(bytes(buf[: len(buf) - keep])))
                    del buf[: len(buf) - keep]
                return False
            if at:
                events.append(PartData(bytes(buf[:at])))
            events.append(PartEnd())
            del buf[: at + len(self._delimiter)]
            self._state = "boundary"
            return True
        return False


def _parse_headers(block: bytes) -> tuple[tuple[str, str], ...]:
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError:
        raise MultipartError("a part's headers are not UTF-8") from None
    headers: list[tuple[str, str]] = []
    for line in text.split("\r\n"):
        if line[:1] in (" ", "\t"):
            raise MultipartError(f"folded part header line: {line!r}")
        name, colon, value = line.partition(":")
        if not colon or not name or not set(name) <= _TOKEN_CHARS:
            raise MultipartError(f"malformed part header line: {line!r}")
        headers.append((name, value.strip(" \t")))
    return tuple(headers)


def parse_header_params(value: str) -> tuple[str, dict[str, str]]:
    """``'form-data; name="traces"; filename="t.jsonl"'`` -> ``("form-data", {...})``.

    The main value is lower-cased, as are parameter names; quoted values may hold ``;`` and
    backslash escapes. Raises ``MultipartError`` on a malformed parameter.
    """
    main, _, rest = value.partition(";")
    params: dict[str, str] = {}
    i, n = 0, len(rest)
    while i < n:
        while i < n and rest[i] in " \t;":
            i += 1
        if i >= n:
            break
        eq = rest.find("=", i)
        if eq < 0:
            raise MultipartError(f"parameter without a value in {value!r}")
        name = rest[i:eq].strip().lower()
        if not name or not set(name) <= _TOKEN_CHARS:
            raise MultipartError(f"malformed parameter name in {value!r}")
        i = eq + 1
        while i < n and rest[i] in " \t":
            i += 1
        if i < n and rest[i] == '"':
            i += 1
            chars: list[str] = []
            while i < n and rest[i] != '"':
                if rest[i] == "\\" and i + 1 < n:
                    i += 1
                chars.append(rest[i])
                i += 1
            if i >= n:
                raise MultipartError(f"unterminated quoted value in {value!r}")
            i += 1
            params[name] = "".join(chars)
        else:
            end = rest.find(";", i)
            end = n if end < 0 else end
            params[name] = rest[i:end].strip()
            i = end
    return main.strip().lower(), params
