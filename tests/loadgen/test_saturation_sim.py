"""Over-saturation on the real simulator: an open-loop stage well below its capacity is stable, one far above
it is found over-saturated and, with --stop-on-oversaturation, ends the run.

The sim (tiny at --speed 0.1, 4 sequences, 48-token replies) completes about 11 requests per second on the
development machine; 3 req/s is well below that, 30 req/s nearly three times above it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlens.util.child import http_child
from loadlens.util.net import free_port
from tests.loadgen.conftest import loadlens, result_of, run_child, write_profile
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture
def small_sim() -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "loadlens.cli", "serve", "--engine", "sim", "--model-profile", "tiny"]
    cmd += ["--gpu-profile", "h100-sxm", "--speed", "0.1", "--knob", "max_num_seqs=4", "--port", str(port)]
    with http_child([*cmd, "--log-level", "warning"], port, cwd=ROOT) as url:
        yield url


@pytest.mark.timeout(180)  # 12 s below + up to 30 s above + start-up and drain, past the 60 s default
def test_a_stage_far_above_capacity_is_found_and_stops_the_run(small_sim: str, tmp_path: Path) -> None:
    profile = write_profile(
        tmp_path / "sat.yaml",
        {
            "seed": 3,
            "stop_timeout_s": 2,
            "defaults": {"endpoint": "chat", "output_tokens": {"mean": 48}},
            "traffic": [{"name": "text", "prompt": {"tokens": {"mean": 64}}}],
            "stages": [
                {"name": "below", "rate": 3, "max_concurrency": 64, "duration": 12},
                {"name": "above", "rate": 30, "max_concurrency": 64, "duration": 60},
                {"name": "never", "rate": 60, "max_concurrency": 64, "duration": 60},
            ],
        },
    )
    proc = run_child(
        loadlens(
            "--profile", str(profile), "--host", small_sim, "--headless", "--results", str(tmp_path / "results"),
            "--metrics-port", "0", "--progress-interval", "0", "--stop-on-oversaturation",
        ),
        timeout=90,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    doc = result_of(tmp_path / "results")
    below, above = doc["stages"]  # the third stage never ran
    assert below["end_reason"] == "duration" and below["saturation"]["verdict"] == "stable", below["saturation"]
    assert below["failed"] == 0 and below["saturation"]["detected_at_s"] is None
    sat = above["saturation"]
    assert above["end_reason"] == "over_saturated" and sat["verdict"] == "over_saturated", sat
    # Judgeable from 11.2 s (a 10 s window after the 10 % settle), confirmed by the next check 5 s later.
    assert 15.0 <= sat["detected_at_s"] <= 30.0 and above["duration"] == pytest.approx(sat["detected_at_s"], abs=1)
    assert sat["latency"]["p_value"] < 0.01 and sat["load"]["p_value"] < 0.01
    assert sat["load"]["growth"] >= sat["load"]["level"] and sat["latency"]["growth"] >= sat["latency"]["level"]
    assert doc["overall"]["over_saturated_stages"] == ["above"] and doc["run"]["completed"] is False
    assert "loadgen: stage above is over-saturated at " in proc.stdout
    assert "OVER-SATURATED: above (found at " in proc.stdout
