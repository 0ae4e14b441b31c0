"""scripts/bench/nested_records.py: records inside a list or a mapping are read back as records, each
refusal naming where the element sits."""

import dataclasses

import pytest

from scripts.bench.nested_records import NestedRecord
from scripts.pipeline.errors import ClefError
from scripts.pipeline.records import Record


@dataclasses.dataclass(frozen=True)
class Leaf(Record):
    x: int


@dataclasses.dataclass(frozen=True)
class Tree(NestedRecord):
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
    with pytest.raises(ClefError, match=r"t.json: by_mode: a: no `x` in the Leaf record"):
        Tree.from_json({**DOC, "by_mode": {"a": {}}}, "t.json")
