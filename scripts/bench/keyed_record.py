"""Records whose JSON holds a field under a key Python cannot spell as a name (`global`, a key with a dot
or a dash): the field carries its key (`json_key`), and to_json / from_json use it in the field's place."""

from __future__ import annotations

import dataclasses
from typing import Any

from scripts.pipeline.records import OMIT_IF_NONE, Record

JSON_KEY = "json_key"


def json_key(key: str, optional: bool = False) -> Any:
    """A field written and read under `key`; `optional`: also left out when None, as records.optional."""
    if optional:
        return dataclasses.field(default=None, metadata={JSON_KEY: key, OMIT_IF_NONE: True})
    return dataclasses.field(metadata={JSON_KEY: key})


def _keys(cls: type) -> dict[str, str]:
    """field name -> its JSON key, for the fields that have one of their own."""
    return {f.name: f.metadata[JSON_KEY] for f in dataclasses.fields(cls) if JSON_KEY in f.metadata}


class KeyedRecord(Record):
    """A Record whose `json_key` fields stand under their keys in the JSON, in their declared place."""

    def to_json(self) -> dict[str, Any]:
        keys = _keys(type(self))
        return {keys.get(name, name): value for name, value in super().to_json().items()}

    @classmethod
    def from_json(cls, doc, where: str):
        if isinstance(doc, dict):
            names = {key: name for name, key in _keys(cls).items()}
            doc = {names.get(key, key): value for key, value in doc.items()}
        return super().from_json(doc, where)
