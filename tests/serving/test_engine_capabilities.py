"""The HTTP layer never asks which engine it has: what differs is a capability declared on the Engine interface."""

from __future__ import annotations

import ast

from exporters.serving.engine import Engine
from exporters.serving.engines.openai.engine import OpenAIProxyEngine
from exporters.serving.engines.sim import SimEngine
from tests.support.paths import ROOT

SERVING = ROOT / "exporters" / "serving"


def _name_checks(tree: ast.AST) -> list[int]:
    """Lines comparing something's ``.name`` or an ``engine`` string with a literal string."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any(
                (isinstance(s, ast.Attribute) and s.attr == "name") or (isinstance(s, ast.Name) and s.id == "engine")
                for s in sides
            )
            literal = any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides)
            literal |= any(isinstance(s, (ast.Set, ast.Tuple, ast.List)) for s in sides)
            if named and literal:
                lines.append(node.lineno)
    return lines


def test_the_http_layer_compares_no_engine_name() -> None:
    found = []
    for path in sorted(SERVING.glob("*.py")):  # the HTTP layer; engines/ holds the engines themselves
        found += [f"{path.relative_to(ROOT)}:{line}" for line in _name_checks(ast.parse(path.read_text()))]
    assert found == []


def test_the_scan_sees_a_name_check() -> None:
    tree = ast.parse("if engine.name == 'openai':\n    pass\nif engine in {'openai'}:\n    pass\n")
    assert _name_checks(tree) == [1, 3]


def test_capabilities_as_declared() -> None:
    assert (Engine.supports_responses_api, Engine.forwards_upstream_errors) == (True, False)
    assert (SimEngine.supports_responses_api, SimEngine.forwards_upstream_errors) == (True, False)
    assert (OpenAIProxyEngine.supports_responses_api, OpenAIProxyEngine.forwards_upstream_errors) == (False, True)
