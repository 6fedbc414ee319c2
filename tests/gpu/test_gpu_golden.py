"""Golden exposition (style R5): exact text, and ``promtool check metrics`` clean except DCGM's names."""

from __future__ import annotations

import subprocess

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporters.gpu.exposition import text_exposition
from tests.gpu.golden import DOCUMENT, GOLDEN, document_json, golden_exporter, render
from tests.support import required

# dcgm-exporter's own label names (modelName, UUID) break Prometheus conventions; --dcgm-compat copies them on
# purpose, so promtool's complaints about these families are expected (node_exporter's checkmetrics.sh keeps
# a similar exclusion list).
LINT_EXCLUDED_PREFIXES = ("DCGM_FI_",)


def test_exposition_matches_golden() -> None:
    assert render() == GOLDEN.read_text(), "regenerate with: .venv/bin/python -m tests.gpu.golden"


def test_document_fixture_is_current() -> None:
    assert document_json() == DOCUMENT.read_text(), "regenerate with: .venv/bin/python -m tests.gpu.golden"


def test_promtool_check_metrics() -> None:
    promtool = required.promtool()
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=GOLDEN.read_bytes(), capture_output=True, timeout=30, check=False
    )
    problems = [
        line
        for line in (proc.stdout + proc.stderr).decode().splitlines()
        if line.strip() and not line.startswith(LINT_EXCLUDED_PREFIXES)
    ]
    assert problems == []
    # Without the DCGM aliases the exposition is fully clean.
    native = "".join(line + "\n" for line in GOLDEN.read_text().splitlines() if "DCGM_FI_" not in line)
    clean = subprocess.run([promtool, "check", "metrics"], input=native.encode(), capture_output=True, timeout=30)
    assert clean.returncode == 0, clean.stdout.decode() + clean.stderr.decode()


class _Families:
    def __init__(self, families: list[object]) -> None:
        self._families = families

    def collect(self) -> object:
        return iter(self._families)


def parsed(text: str) -> tuple[list[tuple[str, str, str]], set[tuple[str, frozenset[tuple[str, str]], float]]]:
    families = list(text_string_to_metric_families(text))
    meta = [(f.name, f.type, f.documentation) for f in families]
    samples = {(s.name, frozenset(s.labels.items()), s.value) for f in families for s in f.samples}
    return meta, samples


def test_fast_encoder_means_what_prometheus_client_means() -> None:
    families = list(golden_exporter().registry.collect())
    ours = text_exposition(families).decode()
    reference = generate_latest(_Families(families)).decode()  # type: ignore[arg-type]
    assert parsed(ours) == parsed(reference)
    assert ours.count("\n") == reference.count("\n")


def test_fast_encoder_escapes_label_values_and_help() -> None:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    g = GaugeMetricFamily("x", "Help with \\ and\nnewline.", labels=["a", "b"])
    g.add_metric(['quote " here', "back\\slash\nnew"], float("inf"))
    g.add_metric(["plain", "plain"], float("nan"))
    c = CounterMetricFamily("c", "A counter.", labels=["a"], created=1.5)
    c.add_metric(["x"], 3.0, created=1.5)
    h = HistogramMetricFamily("h", "A histogram.", labels=["a"])
    h.add_metric(["x"], [("0.5", 1.0), ("+Inf", 2.0)], 3.0)
    families = [g, c, h]
    ours = text_exposition(families).decode()
    reference = generate_latest(_Families(families)).decode()  # type: ignore[arg-type]
    assert parsed(ours)[0] == parsed(reference)[0]

    # NaN != NaN: compare the rest by value, NaN by presence.
    def without_nan(ss: set[tuple[str, frozenset[tuple[str, str]], float]]) -> set[object]:
        return {(n, ls, v) for n, ls, v in ss if v == v}

    assert without_nan(parsed(ours)[1]) == without_nan(parsed(reference)[1])
    assert 'x{a="quote \\" here",b="back\\\\slash\\nnew"} +Inf' in ours
    assert "c_created" in ours
