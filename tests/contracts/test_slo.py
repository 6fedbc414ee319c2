from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadlens.contracts.slo import DEFAULT_SLO_FILE, SLOConfigError, load_slos, parse_slos

BASE: dict[str, Any] = yaml.safe_load(DEFAULT_SLO_FILE.read_text())


def test_packaged_file_loads_with_the_guide_numbers() -> None:
    slos = load_slos()
    assert slos.class_names == ("interactive", "batch")
    assert slos.class_for_priority(0).name == "interactive"
    assert slos.class_for_priority(-5).name == "interactive"
    assert slos.class_for_priority(1).name == "batch"
    assert slos.class_for_priority(10**9).name == "batch"  # beyond every range: nearest end class
    assert slos.class_for_priority(-(10**9)).name == "interactive"
    assert slos.lora_swap.delay_seconds == 0.2
    assert slos.lora_swap.max_delayed_ratio == 0.005
    assert slos.gpu["vram_fluctuation_ratio"] == 0.15
    assert slos.training["grad_norm_jump_factor"] == 3.0
    assert slos.all_thresholds("ttft") == [0.2, 2.5]


def _mutate(path: list[Any], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (["version"], 2, "version must be 1"),
        (["classes"], [], "classes must be a non-empty list"),
        (["classes", 0, "ttft_seconds"], -1, "classes[0].ttft_seconds: must be in (0.0, inf]"),
        (["classes", 0, "ttft_seconds"], "fast", "classes[0].ttft_seconds: must be a number"),
        (["classes", 0, "objective_ratio"], 1.5, "classes[0].objective_ratio: must be in (0.0, 1.0]"),
        (["classes", 0, "itl_seconds"], _DELETE, "classes[0].itl_seconds: missing"),
        (["classes", 1, "name"], "interactive", "duplicate class names"),
        (["classes", 1, "priority_min"], 0, "overlap"),
        (["classes", 1, "priority_min"], 5, "gap between priority ranges"),
        (["classes", 0, "name"], "has space", "must be an identifier-like string"),
        (["lora_swap", "delay_seconds"], True, "lora_swap.delay_seconds: must be a number"),
        (
            ["alerting", "runbook_base_url"],
            "docs/runbooks.md",
            "alerting.runbook_base_url: must be an absolute http(s) URL without a #fragment (a link a browser or "
            "pager can open), got 'docs/runbooks.md'",
        ),
    ],
)
def test_invalid_configs_name_the_field(path: list[Any], value: Any, message: str) -> None:
    with pytest.raises(SLOConfigError) as info:
        parse_slos(_mutate(path, value))
    assert message in str(info.value)


def test_unreadable_and_unparsable_files(tmp_path: Path) -> None:
    with pytest.raises(SLOConfigError, match="cannot read SLO file"):
        load_slos(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: [1\n")
    with pytest.raises(SLOConfigError, match="not valid YAML"):
        load_slos(bad)


def test_a_broken_file_names_file_line_column_and_field(tmp_path: Path) -> None:
    text = DEFAULT_SLO_FILE.read_text().replace("    ttft_seconds: 2.5\n", "    ttft_seconds: -2.5\n")
    bad = tmp_path / "slos.yaml"
    bad.write_text(text)
    line = text.splitlines().index("    ttft_seconds: -2.5") + 1
    with pytest.raises(SLOConfigError) as info:
        load_slos(bad)
    assert str(info.value) == f"{bad}:{line}:5: classes[1].ttft_seconds: must be in (0.0, inf], got -2.5"
