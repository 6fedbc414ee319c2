"""yaml_document: a pydantic error's path finds its line and column; reasons are the validators' own words."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, field_validator, model_validator

from loadlens.contracts.yaml_document import Document, DocumentInvalid, Problem, fail, parse_yaml

TEXT = """\
name: demo
items:
  - size: 1
    colour: red
  - {size: 2}
"""


class Item(BaseModel):
    size: int
    colour: str = "blue"

    @field_validator("size", mode="before")
    @classmethod
    def _small(cls, value: Any) -> Any:
        if value > 1:
            raise fail(f"must be <= 1, got {value}")
        return value


class Doc(BaseModel):
    name: str
    items: list[Item]

    @model_validator(mode="after")
    def _named(self) -> Doc:
        if self.name == "demo" and len(self.items) > 5:
            raise fail("too many items for a demo", "items", refer=("name",))
        return self


def test_marks_point_at_the_key_or_the_item() -> None:
    doc = parse_yaml(TEXT, "f.yaml")
    assert doc.data == {"name": "demo", "items": [{"size": 1, "colour": "red"}, {"size": 2}]}
    assert doc.mark(("items", 0, "colour")) == (4, 5)
    assert doc.mark(("items", 1)) == (5, 5)
    assert doc.mark(("items", 1, "colour")) == (5, 5)  # absent: the mapping that lacks it
    assert doc.mark(()) == (1, 1)
    assert Document({"name": "x"}).mark(("name",)) is None


def test_the_first_mistake_is_named_with_file_line_and_column() -> None:
    with pytest.raises(DocumentInvalid) as err:
        parse_yaml(TEXT, "f.yaml").validate(Doc)
    assert err.value.problem == Problem("f.yaml", 5, 6, ("items", 1, "size"), "items[1].size", "must be <= 1, got 2")
    assert str(err.value) == "f.yaml:5:6: items[1].size: must be <= 1, got 2"


def test_pydantic_reasons_in_the_project_words_and_no_location_in_memory() -> None:
    with pytest.raises(DocumentInvalid) as err:
        Document({"items": []}).validate(Doc)
    assert str(err.value) == "name: missing"
    with pytest.raises(DocumentInvalid) as err:
        Document({"name": "x", "items": [3]}).validate(Doc)
    assert str(err.value) == "items[0]: must be a mapping, got int"


def test_a_reason_may_name_another_field_and_a_label_may_rename_paths() -> None:
    doc = Document({"name": "demo", "items": [{"size": 1}] * 6})
    with pytest.raises(DocumentInvalid) as err:
        doc.validate(Doc, label=lambda loc: "doc." + ".".join(map(str, loc)))
    assert str(err.value) == "doc.items: too many items for a demo"
    with pytest.raises(DocumentInvalid) as err:
        Document({"name": "demo", "items": [{"size": 5}]}).validate(Doc)
    assert err.value.problem.reason == "must be <= 1, got 5"


def test_refer_and_bare() -> None:
    class Pair(BaseModel):
        a: int = 0

        @model_validator(mode="after")
        def _check(self) -> Pair:
            if self.a == 1:
                raise fail("set it here or in {refer}", "b", refer=("a",))
            if self.a == 2:
                raise fail("version must be 1", "a", bare=True)
            return self

    doc = parse_yaml("a: 1\n", "p.yaml")
    with pytest.raises(DocumentInvalid) as err:
        doc.validate(Pair)
    assert str(err.value) == "p.yaml:1:1: b: set it here or in a"
    with pytest.raises(DocumentInvalid) as err:
        parse_yaml("\na: 2\n", "p.yaml").validate(Pair)
    assert str(err.value) == "p.yaml:2:1: version must be 1"
