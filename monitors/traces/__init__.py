"""Chunked JSONL trace streams: a writer that rolls and survives crashes, and a streaming reader.

```
DIR/00000.jsonl  DIR/00001.jsonl ...   one record per line, chunks of at most chunk_bytes
DIR/index.jsonl                       a fixed-width row per record: chunk, offset, length, ...
```
Run ``python -m monitors.traces cat|stat|verify DIR`` to look at one from a shell. The layout
and its guarantees are docs/design.md D9.
"""

from ._layout import IndexRow
from ._reader import TraceReader, aread_records, read_record, read_records, read_row
from ._recovery import Recovery
from ._writer import DEFAULT_CHUNK_BYTES, TraceWriter

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "IndexRow",
    "Recovery",
    "TraceReader",
    "TraceWriter",
    "aread_records",
    "read_record",
    "read_records",
    "read_row",
]
