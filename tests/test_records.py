"""scripts/pipeline/records.py: a record round-trips through JSON, and a missing field is one line."""

import dataclasses
import json

import pytest

from scripts.pipeline.errors import ClefError
from scripts.pipeline.records import SCHEMA, Record


@dataclasses.dataclass(frozen=True)
class Inner(Record):
    max_rel: float
    curve: list[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Outer(Record):
    name: str
    inner: Inner
    maybe: Inner | None = None


def test_a_record_round_trips_through_json_with_nested_records():
    rec = Outer("row_L64", Inner(1e-6, [1e-7, 1e-6]), None)
    doc = json.loads(json.dumps(rec.to_json()))
    assert doc == {"name": "row_L64", "inner": {"max_rel": 1e-6, "curve": [1e-7, 1e-6]}, "maybe": None}
    assert Outer.from_json(doc, "x.json") == rec


def test_a_missing_field_is_one_line_naming_the_file_and_the_field():
    with pytest.raises(ClefError, match=r"x.json: inner: no `max_rel` in the Inner record"):
        Outer.from_json({"name": "a", "inner": {"curve": []}}, "x.json")


def test_an_unknown_key_is_left_out_and_a_default_fills_a_missing_optional_field():
    assert Inner.from_json({"max_rel": 2.0, "newer": 1}, "x") == Inner(2.0, [])


def test_another_schema_is_refused(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema": SCHEMA + 1, "max_rel": 1.0}))
    with pytest.raises(ClefError, match="schema"):
        Inner.read(path, "verify_tflite")


def test_a_record_that_is_not_an_object_is_refused():
    with pytest.raises(ClefError, match="expected a Inner record"):
        Inner.from_json([1], "x")


@dataclasses.dataclass(frozen=True)
class Many(Record):
    rows: list[Inner]
    by_name: dict[str, Inner]


def test_lists_and_maps_of_records_are_read_as_records_and_name_where_one_is_short():
    doc = {"rows": [{"max_rel": 1.0}], "by_name": {"a": {"max_rel": 2.0}}}
    assert Many.from_json(doc, "m.json") == Many([Inner(1.0)], {"a": Inner(2.0)})
    assert Many.from_json(doc, "m.json").to_json() == {
        "rows": [{"max_rel": 1.0, "curve": []}],
        "by_name": {"a": {"max_rel": 2.0, "curve": []}},
    }
    with pytest.raises(ClefError, match=r"m.json: rows\[1\]: no `max_rel`"):
        Many.from_json({"rows": [{"max_rel": 1.0}, {}], "by_name": {}}, "m.json")
