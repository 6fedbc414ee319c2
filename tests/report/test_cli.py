"""``loadlens report`` exit codes: usage errors exit 2 with one line, an unreachable Prometheus exits 1 fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadlens.cli import main
from loadlens.util.net import free_port

FIXTURE = Path(__file__).with_name("fixtures") / "benchmark_result.json"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["report", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--from", "yesterday", "--to", "1795995503"], "--from: not a time: 'yesterday'"),
        (["--from", "1795995503", "--to", "1795995431"], "--to (1795995431.000) must be after --from"),
        (["--from", "2026-11-29T23:37:11Z", "--to", "2026-11-29T23:37:11Z"], "must be after --from"),
        (["--to", "1795995503"], "--from is required"),
        (["--from", "1", "--to", "2", "--rate-interval", "fast"], "--rate-interval: not a Prometheus duration"),
        (["--from", "1", "--to", "2", "--prometheus", "localhost:9090"], "--prometheus: not an http(s) URL"),
        (["--results", "/nonexistent/benchmark_result.json"], "cannot read results file"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(argv, capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("loadlens report: error: ")
    assert message in err


def test_unreachable_prometheus_exits_1_fast(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code, err = _run(["--prometheus", url, "--results", str(FIXTURE), "--out", str(tmp_path)], capsys)
    assert code == 1
    assert err.startswith(f"loadlens report: error: cannot reach Prometheus at {url}")
    # Fast by construction rather than by the clock: the first query was refused at once, it did not wait out
    # the client's timeout (that would say "timed out").
    assert err.endswith("Connection refused\n")
    assert err.count("\n") == 1
    assert not (tmp_path / "index.html").exists()
