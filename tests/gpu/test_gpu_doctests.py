"""The usage examples in module docstrings are executable; keep them true."""

from __future__ import annotations

import doctest
from types import ModuleType

import pytest

from exporters.gpu import allocator, faults, procinfo, stats
from loadlens.contracts import allocator_math


@pytest.mark.parametrize("module", [allocator, allocator_math, faults, procinfo, stats], ids=lambda m: m.__name__)
def test_docstring_examples(module: ModuleType) -> None:
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0
