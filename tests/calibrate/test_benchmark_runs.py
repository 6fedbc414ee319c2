"""``loadlens calibrate RUN --prometheus URL`` reads a ``loadlens load`` run: its closed-loop stages with the
client's figures, and vLLM's engine counters over each stage from the Prometheus that scraped the server. On
the shared live run (the sim, its Prometheus and the packaged quick profile at a tenth of its time)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from exporters.serving.calibrate.benchmark_runs import read_benchmark_stages
from exporters.serving.calibrate.observations import CalibrationInputError
from exporters.serving.engines.sim.knob_plan import startup_state
from loadlens.cli import main
from loadlens.contracts.engine_counters import BUCKETED, SPAN, bucket_counts
from loadlens.contracts.gpu_profile import load_gpu_profile
from loadlens.contracts.kv_capacity import KvCapacity
from loadlens.contracts.model_profile import load_model_profile
from loadlens.contracts.results import parse_result
from tests.support.live import MODEL as LIVE_MODEL
from tests.support.live import LiveRun

pytestmark = pytest.mark.slow


def test_each_measured_stage_with_its_figures_and_the_servers_counters(live_run: LiveRun) -> None:
    stages = read_benchmark_stages(live_run.results_file, live_run.prom.url)
    run = parse_result(json.loads(live_run.results_file.read_text()))
    measured = [s for s in run.stages if not s.warmup]
    assert [(s.name, s.users) for s in stages] == [(s.name, s.target_users) for s in measured]
    assert [s.name for s in stages] == ["c8", "c16", "c32"]
    for stage, st in zip(stages, measured, strict=True):
        assert st.start_timestamp is not None and st.end_timestamp is not None
        assert stage.counters[SPAN] == pytest.approx(st.end_timestamp - st.start_timestamp)
        assert stage.completed == st.completed and stage.figures["median_ttft_ms"] == st.median_ttft_ms
        # Every step is counted once in its bucket and in the count, from the same two scrapes: the +Inf
        # bucket's increase is the count's.
        steps = stage.counters["vllm:iteration_tokens_total_count"]
        buckets = bucket_counts({k: v for k, v in stage.counters.items() if k.startswith(BUCKETED)})
        assert steps > 0 and buckets[-1] == (float("inf"), steps)
        assert stage.counters["vllm:generation_tokens_total"] > 0
        figures = stage.server_figures()
        assert figures["server_mean_itl_ms"] > 0 and figures["server_mean_prefill_ms"] > 0
    # The KV capacity the sim stated through Prometheus: the blocks its start-up derives for the live run's
    # model on its default GPU profile (`serve --gpu-profile` h100-sxm), of 16 tokens.
    blocks = startup_state(load_model_profile(LIVE_MODEL), load_gpu_profile("h100-sxm"), None).knobs
    assert [s.kv_capacity for s in stages] == [KvCapacity(blocks.num_gpu_blocks or 0, 16)] * 3


def test_a_run_without_a_reachable_prometheus_is_refused_in_one_line(live_run: LiveRun) -> None:
    with pytest.raises(CalibrationInputError) as err:
        read_benchmark_stages(live_run.results_file, "http://127.0.0.1:9")
    assert str(err.value).startswith("--prometheus http://127.0.0.1:9: cannot reach Prometheus")
    assert "\n" not in str(err.value)


# Nine replays of the run's stages (two frontend rounds, the delivery-noise check): 26 s alone here, 58-65 s in the
# parallel pass, where the live run's 25 s set-up can fall inside this test's limit too: x5 (timeout_margins.py).
@pytest.mark.timeout(330)
def test_calibrate_fits_a_load_run_and_writes_a_profile_the_sim_loads(
    live_run: LiveRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, report = tmp_path / "fitted.yaml", tmp_path / "report.json"
    argv = ["calibrate", "--replays", "1", str(live_run.results_file.parent), "--prometheus", live_run.prom.url,
            "--model-profile", "tiny", "--profile", str(out), "--no-predict", "--json", str(report)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert [line.split()[0] for line in printed.splitlines() if re.match(r"  c\d+ +mean ", line)] == [
        "c8",
        "c8",
        "c16",
        "c16",
        "c32",
        "c32",
    ]  # the fit's rows: mean ITL and mean prefill of each measured stage
    # What the fit finds on a real-time sim depends on the host (a loaded machine's delays are in the means), so
    # the invariant is that the profile carries the fit: its step cost, or 0 with the reason the report gives.
    fitted = json.loads(report.read_text())
    profile = load_gpu_profile(str(out))
    assert profile.step_overhead_seconds == float(f"{fitted['parameters']['step_overhead_s']:.6g}")
    assert profile.step_overhead_seconds > 0 or "step_overhead_s" in fitted["not_identified"]
