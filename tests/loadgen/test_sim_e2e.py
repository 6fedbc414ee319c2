"""Against the real simulator: `loadlens serve --engine sim` and `loadlens load` as processes, over loopback.

The sim's own view (its serving-layer histograms: arrival to first token sent, per-request TPOT) is the
reference. Stated tolerance: the client's mean TTFT is 0-8 ms above the server's (the client adds the request
upload, loopback and its own parsing), its mean TPOT within 0.5 ms of the server's (those delays cancel).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadlens.util.child import http_child
from loadlens.util.net import free_port
from tests.loadgen.conftest import ROOT, loadlens, result_of, run_child, write_profile

pytestmark = pytest.mark.slow


@pytest.fixture
def sim_server() -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "loadlens.cli", "serve", "--engine", "sim", "--model-profile", "tiny"]
    cmd += ["--gpu-profile", "h100-sxm", "--speed", "0.1", "--port", str(port), "--log-level", "warning"]
    with http_child(cmd, port, cwd=ROOT) as url:
        yield url


def server_mean(text: str, family: str) -> float:
    total = sum(float(v) for v in re.findall(rf"^{family}_sum{{[^}}]*}} (\S+)$", text, re.M))
    count = sum(float(v) for v in re.findall(rf"^{family}_count{{[^}}]*}} (\S+)$", text, re.M))
    return total / count


def test_client_timings_agree_with_the_simulator(sim_server: str, tmp_path: Path) -> None:
    profile = write_profile(
        tmp_path / "sim.yaml",
        {
            "defaults": {"endpoint": "chat", "output_tokens": {"mean": 24}},
            "traffic": [
                {"name": "text", "weight": 6, "prompt": {"tokens": {"mean": 64, "stdev": 16, "min": 16, "max": 128}}},
                {
                    "name": "image",
                    "weight": 3,
                    "prompt": {"tokens": {"mean": 32}},
                    "images": {"count": 1, "width": 128},
                },
                {"name": "long-tail", "weight": 1, "prompt": {"tokens": {"mean": 1000}}},
            ],
            "stages": [
                {"name": "warmup", "warmup": True, "users": 4, "until_requests": 8},
                {"name": "c8", "users": 8, "duration": 2.5},
            ],
        },
    )
    proc = run_child(
        loadlens(
            "--profile", str(profile), "--host", sim_server, "--headless", "--results", str(tmp_path / "results"),
            "--metrics-port", "0", "--progress-interval", "0",
        ),
        timeout=40,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    doc = result_of(tmp_path / "results")
    assert doc["run"]["model"] == "tiny"
    stages = doc["stages"]
    n = sum(s["completed"] for s in stages)
    assert n > 40 and sum(s["failed"] for s in stages) == 0
    assert set(doc["overall"]["models"]) == {"tiny"}
    metrics = httpx.get(sim_server + "/metrics", timeout=5).text
    server_ttft = server_mean(metrics, "gen_ai_server_time_to_first_token_seconds") * 1e3
    server_tpot = server_mean(metrics, "gen_ai_server_time_per_output_token_seconds") * 1e3
    client_ttft = sum(s["mean_ttft_ms"] * s["completed"] for s in stages) / n
    client_tpot = sum(s["mean_tpot_ms"] * s["completed"] for s in stages) / n
    # Serial phase (tests/conftest.py SERIAL). Measured: 6 serial runs on the 2-core dev box while four other
    # sessions ran their tests (load average 5-6): n = 132 each time, client - server TTFT 2.8-4.0 ms, TPOT
    # difference 0.028-0.045 ms; the bounds are 2x and 11x the worst of those.
    assert 0.0 <= client_ttft - server_ttft <= 8.0, (client_ttft, server_ttft)
    assert abs(client_tpot - server_tpot) <= 0.5, (client_tpot, server_tpot)
    # The sim sends continuous usage: per-token ITL, never the chunk fallback.
    assert doc["overall"]["itl_fallback_requests"] == 0
