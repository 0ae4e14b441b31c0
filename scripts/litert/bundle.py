"""One `.tflite` holding the signatures of several: subgraphs kept as converted, constants stored once.

Every row graph and pair carries a full copy of the weights, and the copies are the same bytes (the
same converter folds the same checkpoint tensors the same way). `merge` writes a model whose
subgraphs are the parts' subgraphs unchanged, its signatures renamed (row_L64's `serving_default`
becomes `row_L64`), its operator codes the union of theirs, and its buffers deduplicated by content
(sha256 of the bytes): a weight used by nine signatures is stored once, and tensor by tensor each
subgraph reads the same bytes it read in its own file, so a signature computes what its file does.

The data always goes after the flatbuffer head, each buffer at an aligned absolute offset (the form
the converter uses past 2 GB, which every reader here handles): one code path for the tiny checkpoint
and real width, and the parts' weights are streamed from their mapped files, never held in memory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap
from pathlib import Path

from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

from scripts.litert import model_writer, tflite_file
from scripts.pipeline import profile
from scripts.pipeline.errors import ClefError
from scripts.pipeline.records import Record


@dataclasses.dataclass(frozen=True)
class Part:
    """One source file and what each of its signatures is called in the bundle."""

    path: Path
    signatures: dict[str, str]  # name in the part -> name in the bundle


@dataclasses.dataclass(frozen=True)
class Merged(Record):
    """What `merge` wrote: sizes, and how much the sharing saved (the bundle stage's `sharing`)."""

    bytes: int
    constant_bytes: int  # the bundle's constants, each stored once
    part_constant_bytes: int  # the parts' constants as the parts stored them (a copy per part, or more)
    shared_buffers: int  # the bundle's constants that stand for more than one stored copy
    shared_bytes: int  # bytes of those constants
    signatures: dict[str, int]  # bundle signature -> its subgraph index


@dataclasses.dataclass(frozen=True)
class FileFingerprint(Record):
    """Which converted file a part was (`fingerprint`): the bundle's metadata holds it as each graph's
    `file`, and the release compares it with the file it would package."""

    bytes: int
    head_sha256: str


def fingerprint(path) -> FileFingerprint:
    """Which converted file a part was: its size and the sha256 of its flatbuffer head (every tensor,
    op and buffer offset, and the metadata that names revision, form, shape and commit), read without
    its weights; what the release compares to tell a bundle made from other files (a 27.7 GB graph
    is not read again for it)."""
    with profile.part("hashing"):
        head = tflite_file.read_head(path)
        return FileFingerprint(Path(path).stat().st_size, hashlib.sha256(head).hexdigest())


def _opcode_key(code) -> tuple:
    return (code.deprecatedBuiltinCode, code.builtinCode, tflite_file.text(code.customCode), code.version)


def _refuse_subgraph_references(model, path: Path) -> None:
    """An op that names another subgraph (WHILE, IF, CALL_ONCE, composites) would need its index
    remapped; our graphs have none (the census gate bans control flow), so one is refused, not guessed."""
    for sg in model.subgraphs:
        for op in sg.operators:
            opts = op.builtinOptions
            if opts is not None and any(k.endswith("SubgraphIndex") for k in vars(opts)):
                raise ClefError(f"{path}: op {tflite_file.op_name(model, op)} names a subgraph; cannot bundle it")
            if getattr(op, "largeCustomOptionsOffset", 0) > 1:
                raise ClefError(f"{path}: an op with external custom options; cannot bundle it")


def _digest(buffer, mm) -> tuple[str, int]:
    """sha256 and length of a buffer's data, inline or in the mapped file (no copy of it made)."""
    with profile.part("hashing"):
        if buffer.offset > 1:
            with memoryview(mm) as view:
                return hashlib.sha256(view[buffer.offset : buffer.offset + buffer.size]).hexdigest(), buffer.size
        data = _inline_data(buffer)
        return hashlib.sha256(data).hexdigest(), len(data)


def _inline_data(buffer) -> bytes:
    return bytes(buffer.data) if buffer.data is not None else b""


@dataclasses.dataclass(frozen=True)
class Repeats:
    """Constants a file stores more than once (`duplicate_constants`): how many copies, and their bytes."""

    buffers: int
    bytes: int


def duplicate_constants(path) -> Repeats:
    """Constants a written model stores more than once: read back from the file, every buffer that holds
    data hashed, each repeat of bytes already stored counted. What a bundle
    must not hold (the point of merging is one copy of each weight), checked on the file, not on what
    `merge` meant to write."""
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(path)))
    seen: set[str] = set()
    buffers = repeated_bytes = 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for buffer in model.buffers or []:
            digest, size = _digest(buffer, mm)
            if not size:
                continue
            if digest in seen:
                buffers += 1
                repeated_bytes += size
            seen.add(digest)
    return Repeats(buffers, repeated_bytes)


def merge(parts: list[Part], dst, meta: dict) -> Merged:
    """Write the bundle of `parts` to `dst` (atomically) with `meta` as its METADATA_NAME entry.
    Every signature of every part must be named in its Part, and no two bundle names may clash."""
    names = [n for part in parts for n in part.signatures.values()]
    if len(set(names)) != len(names):
        raise ClefError(f"bundle signature names clash: {sorted(names)}")
    out = schema.ModelT()
    out.version, out.description = 3, "clef-litert bundle"
    out.operatorCodes, out.subgraphs, out.signatureDefs, out.metadata = [], [], [], []
    out.buffers = [schema.BufferT()]  # buffer 0: the empty one every non-constant tensor may name
    opcodes: dict[tuple, int] = {}
    by_hash: dict[str, int] = {}  # sha256 -> bundle buffer index
    sources: dict[int, model_writer.Source] = {}  # bundle buffer -> its data in a part's file
    sizes: dict[int, int] = {}  # bundle buffer -> bytes of data
    reads: dict[int, int] = {}  # bundle buffer -> how many part buffers it stands for
    kept_metadata: set[str] = set()
    files, maps = [], []
    signatures: dict[str, int] = {}
    try:
        for part in parts:
            f = open(part.path, "rb")  # noqa: SIM115  (closed in finally, with its map)
            files.append(f)
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            maps.append(mm)
            model = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(part.path)))
            _refuse_subgraph_references(model, part.path)
            have = {tflite_file.text(s.signatureKey) for s in model.signatureDefs or []}
            if have != set(part.signatures):
                raise ClefError(f"{part.path}: signatures {sorted(have)}, the bundle expects {sorted(part.signatures)}")
            code_map = {}
            for i, code in enumerate(model.operatorCodes):
                key = _opcode_key(code)
                if key not in opcodes:
                    opcodes[key] = len(out.operatorCodes)
                    out.operatorCodes.append(code)
                code_map[i] = opcodes[key]
            metadata_buffers = {entry.buffer for entry in model.metadata or []}
            buffer_map = {}
            for i, buffer in enumerate(model.buffers):
                if i in metadata_buffers:
                    continue  # metadata is rewritten below
                digest, size = _digest(buffer, mm)
                if not size:
                    continue  # an empty buffer: its tensors name buffer 0
                if digest not in by_hash:
                    index = by_hash[digest] = model_writer.external(out, size)
                    external = buffer.offset > 1
                    sources[index] = model_writer.Slice(mm, buffer.offset, size) if external else _inline_data(buffer)
                    sizes[index], reads[index] = size, 0
                buffer_map[i] = by_hash[digest]
                reads[buffer_map[i]] += 1
            base = len(out.subgraphs)
            for sg in model.subgraphs:
                for t in sg.tensors:
                    t.buffer = buffer_map.get(t.buffer, 0)
                for op in sg.operators:
                    op.opcodeIndex = code_map[op.opcodeIndex]
                out.subgraphs.append(sg)
            for sig in model.signatureDefs:
                sig.signatureKey = part.signatures[tflite_file.text(sig.signatureKey)]
                sig.subgraphIndex += base
                signatures[sig.signatureKey] = sig.subgraphIndex
                out.signatureDefs.append(sig)
            for entry in model.metadata or []:
                name = tflite_file.text(entry.name)
                if name == tflite_file.METADATA_NAME or name in kept_metadata:
                    continue  # each part's identity goes into the bundle's own entry; others kept once
                kept_metadata.add(name)
                source = model.buffers[entry.buffer]  # small (a version string, the converter's notes)
                if source.offset > 1:
                    entry.buffer = model_writer.inline(out, mm[source.offset : source.offset + source.size])
                else:
                    entry.buffer = model_writer.inline(out, _inline_data(source))
                out.metadata.append(entry)
        entry = schema.MetadataT()
        entry.name = tflite_file.METADATA_NAME
        entry.buffer = model_writer.inline(out, json.dumps(meta, sort_keys=True).encode())
        out.metadata.append(entry)
        written = model_writer.write(out, sources, dst)
    finally:
        for mm in maps:
            mm.close()
        for f in files:
            f.close()
    shared = [i for i, n in reads.items() if n > 1]
    return Merged(
        bytes=written,
        constant_bytes=sum(sizes.values()),
        part_constant_bytes=sum(sizes[i] * n for i, n in reads.items()),
        shared_buffers=len(shared),
        shared_bytes=sum(sizes[i] for i in shared),
        signatures=signatures,
    )
