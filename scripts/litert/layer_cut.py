"""Where a graph's first n decoder layers end: the op before which a graph can be cut so that what
runs computes those layers only, and the tensor that carries the residual stream across the cut.

The converter names each tensor after the modules on the stack that computed it; a decoder layer's
part reads `Qwen3_5DecoderLayer_<i>/`. It merges identical computations of several layers into one
op named after all of them (a rotary table two attention layers share; the final norm's ops that
match layer 0's input norm), so an op belongs to the highest layer it names. The cut for n layers is
at the first op of layer >= n, and exactly one float32 activation of the residual stream's shape
[1, L, hidden] must cross it (else `cut` says the graph is not laid out layer by layer): that tensor,
computed before the cut with everything it depends on, is the residual stream after n layers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ai_edge_litert import schema_py_generated as schema

from scripts.litert import tflite_file
from scripts.pipeline.errors import ClefError

LAYER = re.compile(r"DecoderLayer_(\d+)/")


def layer_of(name: str) -> int | None:
    """The highest decoder layer a tensor name names, or None (an op outside every layer)."""
    found = [int(i) for i in LAYER.findall(name)]
    return max(found) if found else None


@dataclass
class Cut:
    stop: int  # ops [0, stop) compute the first `layers` decoder layers
    residual: int  # the tensor that carries the residual stream after them
    layers: int


def op_layers(sg) -> list[int | None]:
    """The decoder layer of each op of subgraph `sg` (from its outputs' names), None outside every layer."""
    out = []
    for op in sg.operators:
        found = [layer_of(tflite_file.text(sg.tensors[int(t)].name)) for t in op.outputs if t >= 0]
        found = [i for i in found if i is not None]
        out.append(max(found) if found else None)
    return out


def cut(model, sg_index: int, layers: int, hidden_size: int) -> Cut | None:
    """The cut after the first `layers` decoder layers of subgraph `sg_index`; None when the graph
    has no more layers than that (nothing to cut)."""
    sg = model.subgraphs[sg_index]
    owner = op_layers(sg)
    named = [i for i in owner if i is not None]
    if not named:
        raise ClefError(
            f"subgraph {sg_index}: no tensor names a decoder layer (`DecoderLayer_<i>/`): cannot cut by layer"
        )
    if layers > max(named):
        return None
    stop = next(k for k, i in enumerate(owner) if i is not None and i >= layers)
    produced = {int(t): k for k, op in enumerate(sg.operators) for t in op.outputs if t >= 0}
    crossing = {
        int(t)
        for op in sg.operators[stop:]
        for t in op.inputs
        if t >= 0 and int(t) in produced and produced[int(t)] < stop
    }
    residual = [
        t
        for t in sorted(crossing)
        if sg.tensors[t].type == schema.TensorType.FLOAT32
        and len(sg.tensors[t].shape) == 3
        and int(sg.tensors[t].shape[0]) == 1
        and int(sg.tensors[t].shape[-1]) == hidden_size
    ]
    if len(residual) != 1:
        raise ClefError(
            f"subgraph {sg_index}: {len(residual)} activations of width {hidden_size} cross the cut after layer "
            f"{layers - 1} (op {stop}), not one residual stream"
        )
    return Cut(stop, residual[0], layers)
