"""Records that hold records in lists and mappings (a bench's candidates, its figures per mode), read back
as records: Record.from_json reads a field that is itself a record (or `X | None`), and leaves a
`list[X]` or `dict[str, X]` of records as the JSON it was. NestedRecord reads those too, each element
through its own class's from_json, so one declaration of the fields is the whole schema.

The mechanism belongs with Record (scripts/pipeline/records.py); it is here while that module is not ours
to change.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from scripts.pipeline.records import Record


def _without_none(hint: Any) -> Any:
    """`X | None` -> X; anything else as it is."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def _element(hint: Any) -> type[Record] | None:
    """The Record class of a list's or a mapping's elements (each possibly None), else None."""
    element = _without_none(hint)
    return element if isinstance(element, type) and issubclass(element, Record) else None


def _read(hint: Any, value: Any, where: str) -> Any:
    """`value` read as the records `hint` holds: list[X] element by element, dict[str, X] value by value."""
    hint = _without_none(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list and args and (element := _element(args[0])):
        return [v if v is None else element.from_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict and len(args) == 2 and (element := _element(args[1])):
        return {k: v if v is None else element.from_json(v, f"{where}: {k}") for k, v in value.items()}
    return value


class NestedRecord(Record):
    """A Record whose list[X] and dict[str, X] fields of records are read back as records."""

    @classmethod
    def from_json(cls, doc, where: str):
        record = super().from_json(doc, where)
        hints = typing.get_type_hints(cls)
        changed = {
            f.name: _read(hints[f.name], getattr(record, f.name), f"{where}: {f.name}")
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if getattr(record, f.name) is not None
        }
        return dataclasses.replace(record, **changed)
