"""The training dashboard's proof (the sim load run of test_live_data.py has no training series): a real
training loop on the tiny LoRA model feeds ``TrainingTelemetry``, whose registry ``serve()`` exposes on
/metrics; a GPU exporter reads a probe document of role ``trainer``; a real Prometheus scrapes both under the
stack's job names, and every query of the dashboard (variables substituted) must return data.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from loadlens.contracts.ports import GPU_JOB, TRAINING_JOB
from loadlens.dashboards.catalog import dashboards
from tests.dashboards.support import all_queries, concrete
from tests.support.prometheus import PrometheusServer, require_prometheus

STEPS = 16
# Queries that cannot have data here, each with why.
NO_DATA = {
    # No alert rules are loaded into the test Prometheus (tests/alerts checks the training alerts).
    "loadlens-training / annotation Firing alerts",
}


def _has_data(prom: PrometheusServer, expr: str, start: float, end: float) -> bool:
    data = prom.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1")
    return any(not math.isnan(float(v)) for series in data["result"] for _, v in series["values"])


@pytest.mark.slow
@pytest.mark.timeout(90)  # 14 s in the parallel phase, x5 (tests/support/timeout_margins.py)
def test_every_training_query_returns_data(tmp_path: Path) -> None:
    require_prometheus()
    import torch

    from exporters.gpu.nvml import Nvml
    from exporters.gpu.server import GpuExporter
    from exporters.gpu.sim import SimNvml
    from exporters.gpu.sim_sources import StaticSource
    from exporters.training.hook import TrainingTelemetry
    from exporters.training.maths import CheckpointPolicy
    from exporters.training.metrics import MetricsServer, TrainingMetrics, serve
    from exporters.training.tiny import synthetic_batches, tiny_lora_model
    from tests.gpu import test_gpu_collectors_probe as probe_docs  # a module: its tests are not re-collected
    from tests.gpu.helpers import default_state

    queries = all_queries({"loadlens-training": dashboards()["loadlens-training"]})
    assert {where for where, _ in queries} >= NO_DATA, "NO_DATA names a query that no longer exists"

    # The trainer's allocator: one probe document (this process, role "trainer") on the sim exporter's GPU 0.
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    state = default_state()
    exporter = GpuExporter(
        Nvml(SimNvml(StaticSource(state), max_age=0.0)),
        backend="sim",
        collectors=["probe"],
        proc_root=None,
        probe_dir=str(probe_dir),
        collect_interval=0.2,  # the sampler's pass reads the probe directory; the scrape serves the latest
    )
    doc = probe_docs.document(role="trainer", devices=[probe_docs.device(state.devices[0].uuid)])

    def write_probe() -> None:
        # The reader drops a document older than 3 intervals: rewrite it as the real probe would.
        now = time.time()
        probe_docs.write(probe_dir, doc.model_copy(update={"written_at": now}))

    write_probe()
    exporter.start()
    metrics = TrainingMetrics()
    training_server = serve(metrics)
    gpu_server = MetricsServer(exporter.registry)
    targets = {
        TRAINING_JOB: [training_server.url.removeprefix("http://")],
        GPU_JOB: [gpu_server.url.removeprefix("http://")],
    }
    try:
        with PrometheusServer(tmp_path / "prom", targets=targets) as prom:
            prom.wait_for_up(TRAINING_JOB)
            prom.wait_for_up(GPU_JOB)
            start = time.time()
            # A real loop: 2 micro-batches per step, clipping, a checkpoint policy that saves on every full
            # window (threshold 0) so both decisions occur. No CUDA here: the VRAM gauges are set by hand.
            model = tiny_lora_model(seed=3)
            telemetry = TrainingTelemetry("proof", metrics, policy=CheckpointPolicy(variance_threshold=0.0))
            telemetry.attach(model)
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
            batches = synthetic_batches(STEPS * 2, batch_size=2, seed=3)
            for step in range(STEPS):
                telemetry.step_begin()
                for micro in batches[step * 2 : step * 2 + 2]:
                    loss = model(**micro).loss / 2
                    loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                telemetry.after_step(loss=float(loss.detach()) * 2, lr=1e-3)
                opt.zero_grad()
                metrics.vram_step_peak.labels("proof").set(1e9 + step * 1e6)
                metrics.vram_fluctuation.labels("proof").set(0.01 * step)
                write_probe()
                time.sleep(0.3)  # several scrapes over the run, so rate()/increase() have samples
            telemetry.detach()
            time.sleep(2.5)
            end = time.time()
            got = {m["metric"]["module"] for m in prom.query('loadlens_training_lora_ab_correlation{run="proof"}')}
            assert len(got) == 4, got  # q_proj and v_proj of 2 layers
            empty = [
                f"{where}: {concrete(expr)}"
                for where, expr in queries
                if where not in NO_DATA and not _has_data(prom, concrete(expr), start, end)
            ]
            assert empty == []
    finally:
        training_server.close()
        gpu_server.close()
        exporter.stop()
