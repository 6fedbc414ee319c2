"""The frontend (API-server) fit on synthetic stages whose TTFT − queue − prefill gap is exactly the model's,
its identification rules, and that a profile without the frontend fields replays exactly as before the
stage existed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from exporters.serving.calibrate.frontend_fit import FRONTEND_PARAMS, fit_frontend, gap
from exporters.serving.calibrate.observations import Stage
from exporters.serving.calibrate.replay import StageLoad, replay
from loadlens.contracts.gpu_profile import GPU_DIR, load_gpu_profile
from tests.calibrate.known import model

FIXED, PER_RUNNING = 0.0018, 0.0012


def stage(name: str, running: float, fixed: float = FIXED, per_running: float = PER_RUNNING) -> Stage:
    """100 requests over 10 s, ``running`` on average, queue 0.5 ms and prefill 4 ms each, and a TTFT whose
    gap over them is exactly the model's."""
    n, duration = 100.0, 10.0
    ttft = 0.0005 + 0.004 + fixed + per_running * running
    counters = {
        "vllm:time_to_first_token_seconds_sum": ttft * n,
        "vllm:time_to_first_token_seconds_count": n,
        "vllm:request_queue_time_seconds_sum": 0.0005 * n,
        "vllm:request_queue_time_seconds_count": n,
        "vllm:request_prefill_time_seconds_sum": 0.004 * n,
        "vllm:request_prefill_time_seconds_count": n,
        "vllm:request_inference_time_seconds_sum": running * duration,
    }
    return Stage(name, 8, 240.0, 48.0, duration, int(n), {}, counters)


def test_exact_data_recovers_both_parameters() -> None:
    stages = [stage(f"c{r}", r) for r in (0.9, 1.4, 2.1, 4.5)]
    assert gap(stages[0]) == pytest.approx(FIXED + PER_RUNNING * 0.9, rel=1e-12)
    got = fit_frontend(stages)
    assert got.not_identified == {}
    assert got.values == pytest.approx({"frontend_fixed_s": FIXED, "frontend_per_running_s": PER_RUNNING}, rel=1e-9)
    assert [name for name, *_ in got.rows] == ["c0.9", "c1.4", "c2.1", "c4.5"]
    assert [r for _, r, _, _ in got.rows] == pytest.approx([0.9, 1.4, 2.1, 4.5], rel=1e-12)
    assert all(f == pytest.approx(y, rel=1e-9) for _, _, y, f in got.rows)


def test_one_running_level_leaves_the_per_running_cost_not_identified() -> None:
    got = fit_frontend([stage("a", 2.0), stage("b", 2.0)])
    assert got.not_identified == {
        "frontend_per_running_s": "its column is constant (2 in every row): one with frontend_fixed_s"
    }
    assert got.values == pytest.approx({"frontend_fixed_s": FIXED + 2 * PER_RUNNING, "frontend_per_running_s": 0.0})


def test_fixed_and_negative_parameters() -> None:
    stages = [stage(f"c{r}", r, fixed=0.0) for r in (1.0, 2.0, 4.0)]
    got = fit_frontend(stages, fixed=["frontend_fixed_s"])
    assert got.not_identified == {"frontend_fixed_s": "held at 0 (--fix)"}
    assert got.values["frontend_per_running_s"] == pytest.approx(PER_RUNNING, rel=1e-9)
    # A gap that falls with load: the per-running cost would be negative; it is dropped, the rest refitted.
    falling = [stage(f"c{r}", r, fixed=0.006, per_running=-0.0005) for r in (1.0, 2.0, 4.0)]
    got = fit_frontend(falling)
    assert list(got.not_identified) == ["frontend_per_running_s"]
    assert got.not_identified["frontend_per_running_s"].startswith("fitted below zero (")
    # Both held: the sim without the stage.
    got = fit_frontend(stages, fixed=list(FRONTEND_PARAMS))
    assert got.values == {"frontend_fixed_s": 0.0, "frontend_per_running_s": 0.0}


GOLDEN = {
    "mean_ttft_ms": 1.4201274013127356, "mean_e2el_ms": 34.959133864731484, "median_ttft_ms": 1.421142303797751,
    "p99_ttft_ms": 1.421142303797751, "median_itl_ms": 0.7136388537674065, "p99_itl_ms": 0.7136550777886441,
    "median_e2el_ms": 34.959133864731484, "p99_e2el_ms": 34.959133864731484, "output_throughput": 4104.0,
    "completed": 171.0, "server_mean_ttft_ms": 1.4201274013127356, "server_mean_itl_ms": 0.7135960434978013,
    "server_mean_e2el_ms": 34.959133864731484, "server_mean_queue_ms": 0.7085357091606662,
    "server_mean_prefill_ms": 0.7115916921520693, "server_output_throughput": 4120.5,
    "mean_running": 2.928426142301305,
}  # fmt: skip
"""The replay below on the packaged h100-sxm profile, without client overhead, computed with the sim and the
replay as they were before the frontend stage (commit af1bb98): a profile without the frontend fields must give
these figures exactly. ``completed`` and ``output_throughput`` since the replay measures every request sent inside
the stage to its end, as the load generator does (168 requests, 4,120.5 tok/s when it counted those that ended
inside)."""
LOAD = StageLoad(3, 240, 48, 2.0, warmup_s=0.5)


def test_a_profile_without_the_frontend_replays_exactly_as_before(tmp_path: Path) -> None:
    packaged = replay(model(), load_gpu_profile("h100-sxm"), LOAD)
    assert packaged.figures == GOLDEN
    doc = yaml.safe_load((GPU_DIR / "h100-sxm.yaml").read_text(encoding="utf-8"))
    doc.update(frontend_fixed_seconds=0.0, frontend_per_running_seconds=0.0)
    (tmp_path / "zero.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    zero = replay(model(), load_gpu_profile(str(tmp_path / "zero.yaml")), LOAD, client_overhead_s=0.003)
    packaged = replay(model(), load_gpu_profile("h100-sxm"), LOAD, client_overhead_s=0.003)
    assert (zero.figures, zero.counters) == (packaged.figures, packaged.counters)
