"""Every entry of tests/conftest.py SERIAL names a test file (and function) that exists: a renamed test must
not silently drop back into the parallel phase."""

from __future__ import annotations

import ast

from tests.conftest import SERIAL
from tests.support.paths import ROOT


def test_every_serial_entry_names_an_existing_test() -> None:
    missing = []
    for key in SERIAL:
        path, _, name = key.partition("::")
        file = ROOT / path
        if not file.is_file():
            missing.append(key)
            continue
        if name:
            tree = ast.parse(file.read_text(encoding="utf-8"))
            names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            if name not in names:
                missing.append(key)
    assert missing == []
