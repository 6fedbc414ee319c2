"""loadlens compare: Welch's test against known values (checked by integrating the t density), results side
by side with deltas, significance only where there is a spread, and usage errors with one line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from loadlens.cli import main
from loadlens.experiment.analysis.stats import incomplete_beta, t_two_sided, welch


def t_tail_by_integration(t: float, df: float) -> float:
    def pdf(x: float) -> float:
        log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
        return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))

    n, hi = 200_000, abs(t) + 200.0
    h = (hi - abs(t)) / n
    return 2 * h * sum(pdf(abs(t) + (i + 0.5) * h) for i in range(n))


def test_welch_matches_the_t_distribution() -> None:
    test = welch(10.0, 2.0, 30, 11.0, 2.0, 30)
    assert test is not None
    assert test.t == pytest.approx(-1.0 / math.sqrt(8 / 30), rel=1e-12)
    assert test.df == pytest.approx(58.0, rel=1e-12)
    assert test.p_value == pytest.approx(t_tail_by_integration(test.t, 58.0), rel=1e-6)
    assert t_two_sided(2.0, 1.0) == pytest.approx(1 - 2 * math.atan(2.0) / math.pi, rel=1e-12)  # Cauchy
    assert t_two_sided(0.0, 5.0) == 1.0
    assert incomplete_beta(2.0, 3.0, 0.4) == pytest.approx(0.5248, abs=1e-12)  # 1 - sum binomial terms
    assert welch(1.0, 1.0, 1, 2.0, 1.0, 10) is None and welch(1.0, 0.0, 5, 1.0, 0.0, 5) is None


def result_doc(run_id: str, ttft: float, std: float, n: int, throughput: float) -> dict[str, Any]:
    overall = {"completed": n, "failed": 0, "outcomes": {"success": n}, "mean_ttft_ms": ttft, "std_ttft_ms": std,
               "ttft_samples": n, "p99_ttft_ms": ttft * 2, "output_throughput": throughput}  # fmt: skip
    return {"schema": "loadlens.benchmark_result", "schema_version": 1, "run": {"run_id": run_id},
            "stages": [], "overall": overall}  # fmt: skip


def write(tmp_path: Path, name: str, doc: dict[str, Any]) -> Path:
    (tmp_path / name).mkdir()
    (tmp_path / name / "benchmark_result.json").write_text(json.dumps(doc))
    return tmp_path / name


def test_side_by_side_with_deltas_and_significance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path, "a", result_doc("fp16", 182.0, 40.0, 500, 142.0))
    b = write(tmp_path, "b", result_doc("awq", 315.0, 90.0, 500, 89.0))  # the guide's first table
    page = tmp_path / "out" / "compare.html"
    assert main(["compare", str(a), str(b), "--figures", "mean_ttft_ms,p99_ttft_ms,output_throughput",
                 "--html", str(page)]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["figure", "fp16", "(baseline)", "awq", "delta", "delta", "%", "p"]
    assert lines[1].split()[:5] == ["mean_ttft_ms", "182", "315", "+133", "+73.1"]
    assert lines[1].endswith("*")  # 133 ms on 500 samples each: p far below 0.05
    assert lines[2].split() == ["p99_ttft_ms", "364", "630", "+266", "+73.1", "-"]  # no spread: no test
    assert lines[3].split() == ["output_throughput", "142", "89", "-53", "-37.3", "-"]
    assert lines[4] == "* p < 0.05 (Welch's t-test on means; '-': no spread to test)"
    assert lines[5] == f"page: {page}"
    text = page.read_text()
    assert "<th>fp16 (baseline)</th><th>awq</th>" in text and "+73.1 %" in text


def test_close_means_are_not_significant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path, "a", result_doc("x", 100.0, 30.0, 20, 1.0))
    b = write(tmp_path, "b", result_doc("x", 101.0, 30.0, 20, 1.0))
    assert main(["compare", str(a), str(b), "--figures", "mean_ttft_ms"]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:5] == ["mean_ttft_ms", "100", "101", "+1", "+1.0"] and not row[-1].endswith("*")
    expected = welch(101.0, 30.0, 20, 100.0, 30.0, 20)
    assert expected is not None and row[-1] == f"{expected.p_value:.4g}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nope"], "nope: no such file or directory"),
        (["A"], "give at least two results (or an experiment with two finished trials)"),
        (["A", "B", "--figures", "zzz"], "--figures: no result has 'zzz' (e.g. "),
    ],
)
def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    paths = {"A": write(tmp_path, "a", result_doc("a", 1.0, 1.0, 5, 1.0)),
             "B": write(tmp_path, "b", result_doc("b", 1.0, 1.0, 5, 1.0))}  # fmt: skip
    assert main(["compare", *[str(paths.get(a, a)) for a in argv]]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"loadlens compare: error: {message}") and err.count("\n") == 1
