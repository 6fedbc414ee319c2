"""``parse_labels``: a label set's pairs in their order, escapes undone, commas, braces and ``=`` inside values."""

from __future__ import annotations

from loadlens.contracts.exposition_labels import parse_labels


def test_pairs_in_order_with_escapes_and_separators_inside_values() -> None:
    text = 'b="1",a="x\\"y,z=\\"w\\"}",c="line\\nnext",d="back\\\\slash", e = "spaced"'
    assert parse_labels(text) == [
        ("b", "1"),
        ("a", 'x"y,z="w"}'),
        ("c", "line\nnext"),
        ("d", "back\\slash"),
        ("e", "spaced"),
    ]


def test_empty_and_unquoted() -> None:
    assert parse_labels("") == []
    assert parse_labels('a=""') == [("a", "")]
    assert parse_labels("a=1") == [("a", "")]  # not an exposition: nothing quoted, nothing read as a value
