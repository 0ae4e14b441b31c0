"""Writing a `.tflite` from a flatbuffer model object whose constants are placed after its head.

The bundle (scripts/litert/bundle.py) and the weight storage (scripts/litert/weight_storage.py) both
build a new model head around data that is already in other files or is made one tensor at a time:
`write` packs the head with each distinct string once, then puts every buffer's data at the next
DATA_ALIGN boundary after it (the form the converter uses past 2 GB, which every reader here
handles), streamed from its source, so a graph's weights are never held in memory all at once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import flatbuffers

from scripts.litert import tflite_file
from scripts.pipeline import atomic

# A stand-in offset while the head's length is measured: a flatbuffer leaves a field at its default
# (0) out, so the stand-in must be non-zero and as wide as any real offset for the length to hold.
OFFSET_PLACEHOLDER = 1 << 40


class Slice:
    """Data that lies in an open map (of a source .tflite): `size` bytes at `offset`."""

    def __init__(self, mapped, offset: int, size: int):
        self.mapped, self.offset, self.size = mapped, offset, size


# What a buffer's data comes from: its bytes, a Slice of a mapped file, or a function that makes the
# bytes when they are written (one tensor at a time).
Source = bytes | Slice | Callable[[], bytes]


class _SharedStrings(flatbuffers.Builder):
    """A builder that writes each distinct string once: the subgraphs of a bundle name their tensors
    after the same source modules, and those names were most of a tiny bundle's head (3.2 of 4.7 MB)."""

    def CreateString(self, s, encoding="utf-8", errors="strict"):  # noqa: N802  (flatbuffers' name)
        if not hasattr(self, "_strings"):
            self._strings = {}
        key = s if isinstance(s, bytes) else s.encode(encoding, errors)
        if key not in self._strings:
            self._strings[key] = flatbuffers.Builder.CreateString(self, key)
        return self._strings[key]


def external(model, size: int) -> int:
    """A new buffer of `size` bytes of data after the head (placed by `write`); -> its index."""
    from ai_edge_litert import schema_py_generated as schema

    buf = schema.BufferT()
    buf.offset, buf.size = OFFSET_PLACEHOLDER, size
    model.buffers.append(buf)
    return len(model.buffers) - 1


def inline(model, data: bytes) -> int:
    """A new buffer holding `data` inside the head (small: metadata); -> its index."""
    from ai_edge_litert import schema_py_generated as schema

    buf = schema.BufferT()
    buf.data = list(data)
    model.buffers.append(buf)
    return len(model.buffers) - 1


def _pack(model) -> bytes:
    builder = _SharedStrings(1024)
    builder.Finish(model.Pack(builder), file_identifier=tflite_file.FILE_IDENTIFIER)
    return bytes(builder.Output())


def _data(source: Source):
    """The chunks of a source's bytes."""
    if isinstance(source, Slice):
        with memoryview(source.mapped) as view:
            end = source.offset + source.size
            for lo in range(source.offset, end, tflite_file.COPY_CHUNK):
                yield view[lo : min(lo + tflite_file.COPY_CHUNK, end)]
    elif isinstance(source, (bytes, bytearray)):
        yield source
    else:
        yield source()


def write(model, sources: dict[int, Source], dst) -> int:
    """`model` (its external buffers' sizes set, their offsets placeholders) with each buffer's data
    from `sources` {buffer index: Source}, written atomically to `dst`; -> bytes. The head's length
    does not depend on the offsets' values (placeholders are as wide), so it is built twice."""
    align = tflite_file.DATA_ALIGN
    trial = len(_pack(model))
    start = -(-trial // tflite_file.HEAD_ROOM) * tflite_file.HEAD_ROOM
    at, placed = start, []
    for index in sorted(sources):
        at = -(-at // align) * align
        model.buffers[index].offset = at
        placed.append((at, model.buffers[index].size, sources[index]))
        at += model.buffers[index].size
    head = _pack(model)
    if len(head) != trial:
        raise AssertionError(f"model head {len(head)} bytes, measured {trial}")
    with atomic.writing(dst) as f:
        f.write(head + bytes(start - len(head)))
        for offset, size, source in placed:
            f.write(bytes(offset - f.tell()))
            written = 0
            for chunk in _data(source):
                f.write(chunk)
                written += len(chunk)
            if written != size:
                raise AssertionError(f"buffer at {offset}: {written} bytes written, {size} declared")
    return Path(dst).stat().st_size
