"""Option flags, the same names and values as orjson's, so one ``option=`` serves both."""

from __future__ import annotations

import orjson

__all__ = [
    "OPT_APPEND_NEWLINE",
    "OPT_INDENT_2",
    "OPT_NAIVE_UTC",
    "OPT_NON_STR_KEYS",
    "OPT_OMIT_MICROSECONDS",
    "OPT_PASSTHROUGH_DATACLASS",
    "OPT_PASSTHROUGH_DATETIME",
    "OPT_PASSTHROUGH_SUBCLASS",
    "OPT_SERIALIZE_DATACLASS",
    "OPT_SERIALIZE_NUMPY",
    "OPT_SERIALIZE_UUID",
    "OPT_SORT_KEYS",
    "OPT_STRICT_INTEGER",
    "OPT_UTC_Z",
    "Fragment",
]

#: Write a ``\n`` after the document.
OPT_APPEND_NEWLINE: int = orjson.OPT_APPEND_NEWLINE
#: Pretty-print with two spaces of indentation.
OPT_INDENT_2: int = orjson.OPT_INDENT_2
#: Write a ``datetime`` without ``tzinfo`` as UTC.
OPT_NAIVE_UTC: int = orjson.OPT_NAIVE_UTC
#: Accept dict keys that are not ``str`` (ints, floats, enums, dates, ...).
OPT_NON_STR_KEYS: int = orjson.OPT_NON_STR_KEYS
#: Leave out the microseconds of ``datetime`` and ``time`` values.
OPT_OMIT_MICROSECONDS: int = orjson.OPT_OMIT_MICROSECONDS
#: Hand dataclasses to ``default`` instead of writing their fields.
OPT_PASSTHROUGH_DATACLASS: int = orjson.OPT_PASSTHROUGH_DATACLASS
#: Hand ``datetime``, ``date`` and ``time`` values to ``default``.
OPT_PASSTHROUGH_DATETIME: int = orjson.OPT_PASSTHROUGH_DATETIME
#: Hand subclasses of ``str``, ``int``, ``dict`` and ``list`` to ``default``.
OPT_PASSTHROUGH_SUBCLASS: int = orjson.OPT_PASSTHROUGH_SUBCLASS
#: No effect: dataclasses are written by default (kept for orjson compatibility).
OPT_SERIALIZE_DATACLASS: int = orjson.OPT_SERIALIZE_DATACLASS
#: Write numpy arrays and scalars (large arrays a few rows per step).
OPT_SERIALIZE_NUMPY: int = orjson.OPT_SERIALIZE_NUMPY
#: No effect: ``uuid.UUID`` is written by default (kept for orjson compatibility).
OPT_SERIALIZE_UUID: int = orjson.OPT_SERIALIZE_UUID
#: Write dict keys in sorted order.
OPT_SORT_KEYS: int = orjson.OPT_SORT_KEYS
#: Refuse integers outside the 53-bit range JavaScript holds exactly.
OPT_STRICT_INTEGER: int = orjson.OPT_STRICT_INTEGER
#: Write the UTC offset as ``Z`` rather than ``+00:00``.
OPT_UTC_Z: int = orjson.OPT_UTC_Z

Fragment = orjson.Fragment
"""Pre-encoded JSON, written as it is (orjson's own type)."""
