"""``loadlens calibrate RUN --metrics-before FILE --metrics-after FILE``: a ``loadlens load`` run of one measured
stage against a real sim server, its ``/metrics`` saved just before and just after, stands for that stage
without a Prometheus; and its one-line refusals (exit 2)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporters.serving.calibrate.benchmark_runs import read_benchmark_stages
from loadlens.cli import main
from loadlens.contracts.engine_counters import SPAN
from loadlens.contracts.gpu_profile import load_gpu_profile
from loadlens.contracts.results import parse_result
from loadlens.util.child import http_child
from loadlens.util.net import free_port
from tests.loadgen.conftest import run_child, write_profile
from tests.support.live import CMD

pytestmark = pytest.mark.slow
USERS = 2


@dataclass(frozen=True)
class SnapshotRun:
    result: Path
    before: Path
    after: Path


def _save(url: str, path: Path) -> Path:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        path.write_bytes(resp.read())
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SnapshotRun]:
    tmp = tmp_path_factory.mktemp("snapshots")
    port = free_port()
    serve = [*CMD, "serve", "--engine", "sim", "--model-profile", "tiny", "--port", str(port), "--log-level", "warning"]
    with http_child(serve, port) as url:
        profile = write_profile(tmp / "one.yaml", {
            "traffic": [{"name": "chat", "prompt": {"tokens": 64}, "output_tokens": 24}],
            "stages": [{"name": "c2", "users": USERS, "duration": 6}],
        })  # fmt: skip
        before = _save(url, tmp / "before.txt")
        load = [*CMD, "load", "--profile", str(profile), "--headless", "--host", url, "--results",
                str(tmp / "results"), "--run-id", "one", "--metrics-port", "0"]  # fmt: skip
        proc = run_child(load, timeout=60)
        assert proc.returncode in (0, 3), proc.stdout[-2000:]  # 3: the CPU guard flagged a busy box
        after = _save(url, tmp / "after.txt")
    yield SnapshotRun(tmp / "results" / "one" / "benchmark_result.json", before, after)


def test_the_snapshot_pair_stands_for_the_one_stage(run: SnapshotRun) -> None:
    (stage,) = read_benchmark_stages(run.result, None, (run.before, run.after))
    (st,) = parse_result(json.loads(run.result.read_text())).stages
    assert (stage.name, stage.users, stage.completed) == ("c2", USERS, st.completed)
    assert stage.counters[SPAN] == st.duration
    # Every request the stage completed finished between the snapshots, and at most one a user more (one in
    # flight when the stage ended, finished before the second snapshot).
    successes = stage.counters["vllm:request_success_total"]
    assert st.completed is not None and st.completed >= 20
    assert st.completed <= successes <= st.completed + USERS
    assert stage.kv_capacity is not None and stage.kv_capacity.block_size == 16
    assert stage.server_figures()["server_mean_itl_ms"] > 0


def test_calibrate_fits_it_without_a_prometheus(run: SnapshotRun, tmp_path: Path) -> None:
    out = tmp_path / "fitted.yaml"
    argv = ["calibrate", "--replays", "1", str(run.result), "--metrics-before", str(run.before), "--metrics-after",
            str(run.after),
            "--model-profile", "tiny", "--profile", str(out), "--no-predict"]  # fmt: skip
    assert main(argv) == 0
    assert load_gpu_profile(str(out)).step_overhead_seconds >= 0


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    return lines[-1]


def test_refusals_in_one_line(run: SnapshotRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = [
        "calibrate",
        "--replays",
        "1",
        str(run.result),
        "--model-profile",
        "tiny",
        "--profile",
        str(tmp_path / "p.yaml"),
    ]
    assert _error([*base, "--metrics-before", str(run.before)], capsys).endswith(
        "--metrics-before and --metrics-after go together (the server's /metrics before and after)"
    )
    swapped = ["--metrics-before", str(run.after), "--metrics-after", str(run.before)]
    assert "the server restarted between the snapshots" in _error([*base, *swapped], capsys)
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    no_series = ["--metrics-before", str(empty), "--metrics-after", str(run.after)]
    assert _error([*base, *no_series], capsys).endswith(
        f"{empty}: no vLLM engine series in it (save the server's /metrics exposition)"
    )
    pair = ["--metrics-before", str(run.before), "--metrics-after", str(run.after)]
    both = _error([*base, *pair, "--prometheus", "http://127.0.0.1:9"], capsys)
    assert both.endswith("--prometheus or --metrics-before/--metrics-after: one source of the server's counters")
