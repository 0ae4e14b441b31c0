"""Typed records: what one stage writes and another reads, as dataclasses with one JSON schema.

A record is written with `to_json` (its fields, nested records included, under their own names, or a
key of their own: keyed()) and read back with `read`/`from_json`, which refuses a document missing a
field with one line naming the file and the field: a renamed key surfaces where it is read, not as a
KeyError three stages later. Keys a reader does not know are kept out of the record and do not fail it,
so an older reader takes a newer file. A field that is one of several records (`A | B`) is read as the
one whose required fields the document has, refused with one line when none or more than one does.
SCHEMA is the version of these shapes; a record that carries `schema` is held to it.

Each record lives beside the code that makes it (scripts/checks/*, scripts/release/*, scripts/bench/*)
and subclasses Record; this module holds only the mechanism, so it imports nothing of ours but errors.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from scripts.pipeline.errors import ClefError

SCHEMA = 1
R = TypeVar("R", bound="Record")
OMIT_IF_NONE = "omit_if_none"
JSON_KEY = "json_key"


def optional(default=None):
    """A field a record holds only when it has a value: left out of the JSON when None (a figure some
    runs do not measure), and None when a document lacks it."""
    return dataclasses.field(default=default, metadata={OMIT_IF_NONE: True})


def keyed(key: str, optional: bool = False) -> Any:
    """A field the JSON holds under `key`, a key Python cannot spell as a name (`global`, one with a dot or
    a dash), in the field's place; `optional`: also left out when None, as optional() is."""
    if optional:
        return dataclasses.field(default=None, metadata={JSON_KEY: key, OMIT_IF_NONE: True})
    return dataclasses.field(metadata={JSON_KEY: key})


def _key(f: dataclasses.Field) -> str:
    """The key a field stands under in the JSON: its own (keyed()) or its name."""
    return f.metadata.get(JSON_KEY, f.name)


def _plain(value: Any) -> Any:
    """A field's value as JSON holds it: records as their fields, tuples as lists, paths as strings."""
    if isinstance(value, Record):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _record_type(hint: Any) -> type[Record] | None:
    """The Record class a field's annotation names, directly or as `X | None`, else None."""
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        found = [a for a in typing.get_args(hint) if isinstance(a, type) and issubclass(a, Record)]
        return found[0] if len(found) == 1 else None
    return None


def _record_union(hint: Any) -> list[type[Record]]:
    """The Record classes a field's annotation offers when it names more than one (`A | B`, `A | B | None`)."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return []
    found = [a for a in typing.get_args(hint) if isinstance(a, type) and issubclass(a, Record)]
    return found if len(found) > 1 else []


def _required(cls: type[Record]) -> set[str]:
    """The JSON keys a document must hold to be a `cls` record."""
    return {
        _key(f)
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }


def _one_of(choices: list[type[Record]], value: Any, where: str) -> Record:
    """`value` as the one record of `choices` whose required fields it has."""
    names = " or ".join(c.__name__ for c in choices)
    if not isinstance(value, dict):
        raise ClefError(f"{where}: expected a {names} record (a JSON object), got {type(value).__name__}")
    fits = [c for c in choices if _required(c) <= value.keys()]
    if len(fits) != 1:
        raise ClefError(f"{where}: its fields fit {len(fits)} of {names}, not one; rerun the stage that writes it")
    return fits[0].from_json(value, where)


def _without_none(hint: Any) -> Any:
    """`X | None` -> X; anything else as it is."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def _read_value(hint: Any, value: Any, where: str) -> Any:
    """A field's JSON value as its annotation says: a record, a list of records, a {key: record} map
    (each possibly None), or the value itself."""
    if value is None:
        return None
    if choices := _record_union(hint):
        return _one_of(choices, value, where)
    nested = _record_type(hint)
    if nested is not None:
        return nested.from_json(value, where)
    hint = _without_none(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list and args and (element := _record_type(args[0])) and isinstance(value, list):
        return [v if v is None else element.from_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict and len(args) == 2 and (element := _record_type(args[1])) and isinstance(value, dict):
        return {k: v if v is None else element.from_json(v, f"{where}[{k}]") for k, v in value.items()}
    return value


class Record:
    """Mixin for a dataclass that crosses a stage boundary as JSON."""

    def to_json(self) -> dict[str, Any]:
        """The record's fields, in declaration order, as JSON holds them (an `optional` one only when set)."""
        return {
            _key(f): _plain(getattr(self, f.name))
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if not (f.metadata.get(OMIT_IF_NONE) and getattr(self, f.name) is None)
        }

    @classmethod
    def from_json(cls: type[R], doc: Any, where: str) -> R:
        """The record `doc` holds; one line naming `where` and the first field it lacks otherwise."""
        if not isinstance(doc, dict):
            raise ClefError(f"{where}: expected a {cls.__name__} record (a JSON object), got {type(doc).__name__}")
        if "schema" in doc and doc["schema"] != SCHEMA:
            raise ClefError(f"{where}: record schema {doc['schema']!r}, this clef reads schema {SCHEMA}")
        hints = typing.get_type_hints(cls)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            key = _key(f)
            if key not in doc:
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                    continue
                raise ClefError(f"{where}: no `{key}` in the {cls.__name__} record; rerun the stage that writes it")
            values[f.name] = _read_value(hints[f.name], doc[key], f"{where}: {key}")
        return cls(**values)

    @classmethod
    def read(cls: type[R], path: str | Path, producer: str | None = None) -> R:
        """The record a stage wrote at `path`, or one line naming the stage that writes it."""
        from scripts.pipeline import layout

        return cls.from_json(json.loads(layout.require(path, producer).read_text()), str(path))
