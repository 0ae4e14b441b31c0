"""Names for the maps our functions pass around whose keys the data brings (a tensor's name, a file's
path), as opposed to records, whose fields we define (dataclasses subclassing records.Record).

A map keyed by data is a dict by nature; naming it says which map a signature takes or returns. Imports
nothing of ours and not torch (the tensor type is named for type checkers only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

Tensors = dict[str, "torch.Tensor"]
"""Tensor name -> value: a signature's inputs or outputs, a model state, a checkpoint's weights."""

Shapes = dict[str, tuple[int, ...]]
"""Tensor name -> shape."""

FileDigests = dict[str, str]
"""A file's path (relative to a root) or name -> its sha256 in hex."""

ForeignJson = dict[str, Any]
"""A JSON document whose keys a format we do not define fixes: a checkpoint's config.json, a Vega-Lite
chart, dvc.lock, params.yaml as read."""
