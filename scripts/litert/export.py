"""Export a row graph to LiteRT: checks first, then litert_torch.convert, then our metadata, then an
atomic write, so a conversion that fails midway leaves no `.tflite` behind.

Conversion is litert_torch's lightweight mode written straight to a scratch file: constants are
handled lazily, so converting clef-flash-width weights costs little more memory than the weights
themselves (the default mode's peak is several times the weights: docs/real-width.md), and
the op census of our graphs is the same in both modes (checked at L=64 and L=256).

The metadata entry (`clef_litert`, JSON) makes the file self-describing: repo, revision, form, L,
contract, the params it read, the versions of torch / transformers / litert-torch, and the git commit
(and whether the pipeline's inputs were clean) that produced it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from scripts.checkpoint.snapshot import SnapshotRecord
from scripts.layers import kernel_form, weight_precision
from scripts.layers.kernel_form import Form
from scripts.litert import tflite_file, weight_storage
from scripts.pipeline import atomic, params, profile, provenance, quiet
from scripts.pipeline.errors import ClefError
from scripts.pipeline.provenance import GitState
from scripts.pipeline.records import Record, optional
from scripts.qwen35 import model_change
from scripts.qwen35.pair_graph import PairContract
from scripts.qwen35.row_graph import RowContract

DEFAULT_SIGNATURE = "serving_default"  # the name litert_torch.convert gives a lone signature


def check_exportable(form: Form, length: int, max_positions: int) -> None:
    """Refuse, before any conversion, what the exporter cannot turn into a delegate-ready graph."""
    if not isinstance(length, int) or length <= 0:
        raise ClefError(f"L={length!r} is not a positive integer")
    params.within_context(f"L={length}", length, max_positions)
    kernel_form.check_exportable(form)


def convert(module: torch.nn.Module, sample_kwargs: dict, path: Path) -> None:
    """litert_torch.convert of a module on named float32 inputs, written to `path`."""
    convert_signatures({DEFAULT_SIGNATURE: (module, sample_kwargs)}, path)


def convert_signatures(signatures: dict, path: Path) -> None:
    """One model with several named signatures {name: (module, sample_kwargs)} written to `path`;
    modules that share parameters share their weight buffers in the file. A Linear weight larger than
    a GPU binds as one buffer is converted as row blocks (split_linear: exact)."""
    import litert_torch

    quiet.mute_converter_progress()  # its step-by-step console; one line of ours instead
    print(f"converting {', '.join(signatures)} with litert-torch ({quiet.DEBUG_ENV}=1 shows each step)", flush=True)
    converter = litert_torch.Converter()
    modules = [module for module, _ in signatures.values()]
    try:
        with (
            profile.part("conversion"),
            model_change.changed(torch.nn.ModuleList(modules), split_over=tflite_file.MAX_CONSTANT_BYTES),
        ):
            for name, (module, kwargs) in signatures.items():
                converter.signature(name, module.eval(), sample_kwargs=kwargs)
            converter.convert(lightweight_conversion=True).export(str(path))
    finally:
        release_export_trace()


def convert_row(model, host, length: int, path: Path) -> None:
    """The row graph of L=`length` of the patched stack `model` converted to `path` (a scratch file)."""
    from scripts.qwen35 import row_graph

    convert(row_graph.ClefRowPrefill(model, length), host.record([0], length), path)


def convert_pair(model, host, prefix: int, suffix: int, path: Path) -> None:
    """The pair of prefix P and suffix S of `model`: its two signatures over one copy of the weights,
    each traced on a record of its own shape (the suffix's state from the prefix's)."""
    from scripts.qwen35 import pair_graph

    first_half = pair_graph.PairPrefix(model, prefix).eval()
    second_half = pair_graph.PairSuffix(model, prefix, suffix).eval()
    first = host.record([0], prefix)
    with torch.no_grad():
        state = {k: v for k, v in first_half(**first).items() if k != "hidden"}
    convert_signatures(
        {"prefix": (first_half, first), "suffix": (second_half, {**host.record([0], suffix, start=1), **state})},
        path,
    )


def release_export_trace() -> None:
    """Drop what torch.export keeps of its last trace. torch 2.13 leaves a module-level map from fake
    tensors to graph nodes (`_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT`, cleared only when the next
    trace starts), and through the nodes it keeps every parameter of the exported model alive: a stage
    that frees the stack after converting would hold the weights twice once the interpreter loads."""
    from torch.fx.experimental import proxy_tensor

    proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT.clear()


@dataclasses.dataclass(frozen=True, kw_only=True)
class GraphMetadata(Record):
    """What a converted graph says about itself (`metadata`), embedded as its METADATA_NAME entry: what
    `clef audit` prints from the file alone. A row has L, a pair P and S."""

    repo: str
    revision: str
    source: str
    form: str
    weights: str  # the precision its Linear weights are stored at
    kind: str
    L: int | None = optional()
    P: int | None = optional()
    S: int | None = optional()
    contract_version: int
    contract: RowContract | PairContract
    params: dict[str, Any]  # the params.yaml values the export read
    versions: dict[str, str | None]  # torch, transformers, litert-torch, ai-edge-litert
    git: GitState


def metadata(
    rec: SnapshotRecord,
    form: str,
    weights: str,
    contract: RowContract | PairContract,
    shape: dict[str, Any],
    params_used: dict[str, Any],
) -> GraphMetadata:
    """What `clef audit` prints from the file alone. `shape` is {"kind": "row", "L": ..} or
    {"kind": "pair", "P": .., "S": ..}; `weights` the precision its Linear weights are stored at;
    `params_used` the params.yaml values the export read."""
    versions = provenance.package_versions()
    return GraphMetadata(
        repo=rec.repo,
        revision=rec.revision,
        source=rec.source,
        form=form,
        weights=weights,
        **shape,
        contract_version=contract.version,
        contract=contract,
        params=params_used,
        versions={k: versions[k] for k in ("torch", "transformers", "litert-torch", "ai-edge-litert")},
        git=provenance.git_state(),
    )


def write(out: Path, raw: Path, meta: dict, applied: weight_precision.Applied) -> int:
    """The converted file `raw` (a scratch file beside `out`, used up) with its Linear weights stored
    at `applied.precision` (the model was quantized with weight_precision.apply: `applied`) and the
    metadata embedded, written atomically to `out`; -> bytes. Refused before anything is written: a
    graph that fails the census gate (tflite_file.violations), and one where fewer weight elements
    could be stored at the precision than the model's Linear layers hold (a Linear kept at float32)."""
    if applied.precision == "fp32":
        return _write(out, raw, meta)
    with atomic.scratch_file(out, ".stored") as stored_path:
        stored = weight_storage.store(raw, stored_path, applied.precision)
        raw.unlink()
        if stored.float32_bytes // 4 < applied.elements:
            raise ClefError(
                f"{out}: {stored.float32_bytes // 4} weight elements stored at {applied.precision}, the model's "
                f"{applied.linears} Linear layers hold {applied.elements} ({stored.kept_float32} FULLY_CONNECTED "
                "weights did not round-trip and stay float32)"
            )
        return _write(out, stored_path, {**meta, "weight_storage": stored.to_json()})


def _write(out: Path, raw: Path, meta: dict) -> int:
    census = tflite_file.census(raw)
    found = tflite_file.violations(census)
    if found:
        raise ClefError(f"{out}: the converted graph fails the census gate: {'; '.join(found)}")
    found = weight_storage.mismatch(census, meta["weights"])
    if found:
        raise ClefError(f"{out}: {'; '.join(found)}")
    return tflite_file.write_with_metadata(raw, out, meta, consume=True)
