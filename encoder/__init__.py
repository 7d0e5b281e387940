"""Cooperative JSON encoding, byte-identical to ``orjson.dumps``, for documents of any size.

``encode``/``iterencode``/``dump`` are the blocking drivers; ``aiterencode``/``adump`` give the
event loop back every ``budget`` seconds so no single step stalls it. They bound each step
rather than move the work to a thread, where orjson would hold the GIL (docs/design.md D1).
"""

from ._models import ModelDump, record_dump
from .aio import DEFAULT_BUDGET, adump, aiterencode
from .errors import EncodeError
from .options import (
    OPT_APPEND_NEWLINE,
    OPT_INDENT_2,
    OPT_NAIVE_UTC,
    OPT_NON_STR_KEYS,
    OPT_OMIT_MICROSECONDS,
    OPT_PASSTHROUGH_DATACLASS,
    OPT_PASSTHROUGH_DATETIME,
    OPT_PASSTHROUGH_SUBCLASS,
    OPT_SERIALIZE_DATACLASS,
    OPT_SERIALIZE_NUMPY,
    OPT_SERIALIZE_UUID,
    OPT_SORT_KEYS,
    OPT_STRICT_INTEGER,
    OPT_UTC_Z,
    Fragment,
)
from .sync import DEFAULT_CHUNK_SIZE, dump, encode, iterencode

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_CHUNK_SIZE",
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
    "EncodeError",
    "Fragment",
    "ModelDump",
    "adump",
    "aiterencode",
    "dump",
    "encode",
    "iterencode",
    "record_dump",
]
