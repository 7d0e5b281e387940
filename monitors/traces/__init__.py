"""Chunked JSONL trace streams in prime-rl's layout: a writer that rolls and survives
crashes, and streaming readers.

```
RUN/monitors/file/traces/stream/00000.jsonl.zst ...  one record per line, chunks of at most
                                                     chunk_bytes; full ones sealed with zstd
RUN/monitors/file/traces/stream.index.jsonl          a JSON row per record: prime-rl's
                                                     index_row (line, chunk, offset, id, ...)
```
Every reader takes a run's directory or a stream's. Run ``nodewise traces
ls|cat|stat|verify RUN`` or ``get RUN ID`` to look at one from a shell, or ``zstd -dcf
STREAM/0* | jq``. The layout and its guarantees are docs/design.md D9 and D17.
"""

from ._layout import IndexRow
from ._reader import (
    TraceReader,
    aread_records,
    find_record,
    find_row,
    read_record,
    read_records,
    read_row,
)
from ._recovery import Recovery
from ._writer import DEFAULT_CHUNK_BYTES, TraceWriter

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "IndexRow",
    "Recovery",
    "TraceReader",
    "TraceWriter",
    "aread_records",
    "find_record",
    "find_row",
    "read_record",
    "read_records",
    "read_row",
]
