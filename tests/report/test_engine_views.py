"""The report draws the serving view of the engine Prometheus scraped: ``loadlens-serving-sglang`` when the
serving job has sglang: series in the window, ``loadlens-serving`` otherwise, both for both. Which
dialects a window has is asked of a real Prometheus on the recorded expositions (tests/fixtures/sglang/,
tests/support/recorded_engines.py: sglang's at the recording's times, vLLM's an hour later), and
``loadlens report`` over the sglang window draws the sglang view's engine charts."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from loadlens.cli import main
from loadlens.dashboards.catalog import LOAD_TEST_DASHBOARDS, dashboards
from loadlens.dashboards.model import Dashboard
from loadlens.report.engines import dialect_query, engine_dialects, report_boards
from loadlens.util.prometheus import PrometheusClient
from tests.support.prometheus import PrometheusServer
from tests.support.recorded_engines import recorded_prometheus, window

BOARDS = dashboards()
# The sglang view's panels that read sglang: series (the rest are the vLLM view's own queries).
SGLANG_ENGINE_PANELS = ["Running / waiting", "KV cache usage", "Preemptions", "Queue time", "Prefill time",
                        "Aborted requests"]  # fmt: skip


def titles(board_stem: str, boards: Mapping[str, Dashboard]) -> list[str]:
    return [p.title for p in boards[board_stem].panels()]


def test_serving_view_by_dialect() -> None:
    assert LOAD_TEST_DASHBOARDS == ("loadlens-overview", "loadlens-gpu", "loadlens-serving")
    for found in ((), ("vllm",)):
        boards = report_boards(BOARDS, found)
        assert list(boards) == ["loadlens-overview", "loadlens-gpu", "loadlens-serving"]
        assert all(boards[s] is BOARDS[s] for s in boards)
    boards = report_boards(BOARDS, ("sglang",))
    assert list(boards) == ["loadlens-overview", "loadlens-gpu", "loadlens-serving-sglang"]
    assert boards["loadlens-serving-sglang"] is BOARDS["loadlens-serving-sglang"]
    both = report_boards(BOARDS, ("sglang", "vllm"))
    assert list(both) == ["loadlens-overview", "loadlens-gpu", "loadlens-serving", "loadlens-serving-sglang"]
    assert both["loadlens-serving"] is BOARDS["loadlens-serving"]
    # With both, the sglang view adds only its engine panels: the others would be the same charts again.
    assert titles("loadlens-serving-sglang", both) == SGLANG_ENGINE_PANELS
    assert len(BOARDS["loadlens-serving-sglang"].panels()) == 13


def test_the_dialect_query() -> None:
    query = dialect_query("sglang", 300)
    first, second, *_ = query.split(" or ")
    assert first == 'count(count_over_time(sglang:num_running_reqs{job="loadlens-serve"}[300s]))'
    assert second == 'count(count_over_time(sglang:num_queue_reqs{job="loadlens-serve"}[300s]))'
    assert "sglang:time_to_first_token_seconds_count{" in query and "vllm:" not in query
    assert query.count(" or ") == 11  # the 12 counterparts of the mapping
    assert dialect_query("vllm", 60).count(" or ") == 16  # every mapped vLLM series


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    with recorded_prometheus(tmp_path_factory.mktemp("report-engines")) as server:
        yield server


@pytest.mark.slow
def test_dialects_found_in_each_window(prom: PrometheusServer) -> None:
    client = PrometheusClient(prom.url)
    (s0, s1), (v0, v1) = window("sglang"), window("vllm")
    assert engine_dialects(client, s0, s1) == ("sglang",)
    assert engine_dialects(client, s0 + 200, s0 + 230) == ("sglang",)  # a part of it
    assert engine_dialects(client, v0, v1) == ("vllm",)
    assert engine_dialects(client, s0, v1) == ("vllm", "sglang")
    assert engine_dialects(client, s0 - 7200, s0 - 600) == ()  # before the recording


@pytest.mark.slow
def test_report_over_an_sglang_window_draws_the_sglang_view(prom: PrometheusServer, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    start, end = window("sglang")
    out = tmp_path / "report"
    code = main(["report", "--prometheus", prom.url, "--from", str(start + 60), "--to", str(end), "--out", str(out),
                 "--rate-interval", "1m"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    page = (out / "index.html").read_text(encoding="utf-8")
    # The recording has engine series only: the charts drawn are the sglang view's engine panels, in the
    # page's question order (latency, then the engine's queue), each naming its dashboard.
    assert re.findall(r'<img alt="([^"]+)"', page) == ["Queue time", "Prefill time", "Running / waiting",
                                                      "KV cache usage", "Preemptions", "Aborted requests"]  # fmt: skip
    assert set(re.findall(r'<span class="src">\((.*?) ›', page)) == {"loadlens / Serving engine (sglang)"}
    assert "loadlens / Serving engine ›" not in page
