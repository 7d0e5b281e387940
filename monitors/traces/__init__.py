"""Chunked JSONL trace streams: a writer that rolls and survives crashes, and a streaming reader.

```
DIR/00000.jsonl.zst DIR/00001.jsonl ...  one record per line, chunks of at most chunk_bytes;
                                         full ones sealed with zstd (seekable format)
DIR/index.jsonl                          a fixed-width row per record: chunk, offset, id, ...
```
Run ``python -m monitors.traces cat|stat|verify DIR`` or ``get DIR ID`` to look at one from
a shell, or ``zstd -dcf DIR/0* | jq``. The layout and its guarantees are docs/design.md D9.
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
