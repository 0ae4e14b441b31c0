"""scripts/pipeline/records.py: a record round-trips through JSON, and a missing field is one line."""

import dataclasses
import json

import pytest

from scripts.pipeline import records
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


# records inside a list or a mapping are read back as records, each refusal naming where it sits


@dataclasses.dataclass(frozen=True)
class Leaf(Record):
    x: int


@dataclasses.dataclass(frozen=True)
class Tree(Record):
    name: str
    leaves: list[Leaf]
    by_mode: dict[str, Leaf | None]
    maybe: dict[str, Leaf] | None
    plain: dict[str, int]


DOC = {"name": "t", "leaves": [{"x": 1}], "by_mode": {"a": {"x": 2}, "b": None}, "maybe": None, "plain": {"k": 3}}


def test_elements_are_records_and_the_json_comes_back_unchanged():
    tree = Tree.from_json(DOC, "t.json")
    assert tree.leaves == [Leaf(1)] and tree.by_mode == {"a": Leaf(2), "b": None}
    assert tree.maybe is None and tree.plain == {"k": 3}
    assert tree.to_json() == DOC
    assert Tree.from_json({**DOC, "maybe": {"c": {"x": 4}}}, "t.json").maybe == {"c": Leaf(4)}


def test_an_element_missing_a_field_is_refused_where_it_sits():
    with pytest.raises(ClefError, match=r"t.json: leaves\[0\]: no `x` in the Leaf record"):
        Tree.from_json({**DOC, "leaves": [{}]}, "t.json")
    with pytest.raises(ClefError, match=r"t.json: by_mode\[a\]: no `x` in the Leaf record"):
        Tree.from_json({**DOC, "by_mode": {"a": {}}}, "t.json")


@dataclasses.dataclass(frozen=True)
class Keyed(Record):
    name: str
    global_: float = records.keyed("global")
    small: float | None = records.keyed("max_where_abs_lt_0.1", optional=True)


def test_a_keyed_field_stands_under_its_key_in_its_place_and_is_read_back_from_it():
    rec = Keyed("a", 0.5, None)
    assert list(rec.to_json().items()) == [("name", "a"), ("global", 0.5)]
    assert Keyed.from_json({"name": "a", "global": 0.5, "max_where_abs_lt_0.1": 2.0}, "k.json").small == 2.0
    # a document under the field's Python name is not read as the keyed field
    with pytest.raises(ClefError, match=r"k.json: no `global` in the Keyed record"):
        Keyed.from_json({"name": "a", "global_": 0.5}, "k.json")


# a field that is one of several records is read as the one whose required fields the document has


@dataclasses.dataclass(frozen=True)
class Ran(Record):
    ok: bool
    figure: float


@dataclasses.dataclass(frozen=True)
class Refused(Record):
    ok: bool
    why: str


@dataclasses.dataclass(frozen=True)
class Either(Record):
    outcome: Ran | Refused
    maybe: Ran | Refused | None = None


def test_a_union_of_records_is_read_as_the_one_whose_fields_the_document_has():
    for rec in (Either(Ran(True, 1.5)), Either(Refused(False, "int8"), Ran(True, 2.0))):
        assert Either.from_json(json.loads(json.dumps(rec.to_json())), "x") == rec
    assert type(Either.from_json({"outcome": {"ok": False, "why": "w"}}, "x").outcome) is Refused


@pytest.mark.parametrize(
    "outcome, says",
    [
        ({"ok": True}, "fit 0 of Ran or Refused"),
        ({"ok": True, "figure": 1.0, "why": "w"}, "fit 2 of Ran or Refused"),
        ([1], "expected a Ran or Refused record"),
    ],
)
def test_a_union_of_records_none_or_several_of_which_fit_is_one_line(outcome, says):
    with pytest.raises(ClefError, match=f"x: outcome: .*{says}"):
        Either.from_json({"outcome": outcome}, "x")
