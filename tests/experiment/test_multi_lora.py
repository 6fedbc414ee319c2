"""multi-lora (guide 2.2): the device watch's figures (loadlens/experiment/device.py), the multi_lora analysis, the
experiment file's adapter count and weights, and the allocator path fed by the in-process probe's documents.

The probe test runs the real probe writer (``exporters.probe.Probe``, with the fake torch of tests/probe/fakes.py
whose ``memory_stats()`` follow the allocator pattern docs/probe-documents.md derives for guide 2.2: 8 requests
of 1.2 MB per adapter, each a large-pool block of 1 200 128 B, 20 MiB segments: reserved 20, 20, 40 MiB) and a
small HTTP server standing in for the serving process: each 1-token request to an adapter changes the fake
allocator and records the load, as the vLLM plugin does, and the session reads the step from the document."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from exporters.probe.probe import Probe
from exporters.serving.engine import LoRARequest
from exporters.serving.engines.sim.virtual_time import run_virtual
from loadlens.contracts.allocator_math import AllocatorReading
from loadlens.contracts.experiment_result import (
    ExperimentInfo,
    ExperimentResult,
    ServerInfo,
    Stat,
    Trial,
    parse_experiment_result,
)
from loadlens.contracts.slo import load_slos
from loadlens.experiment.analysis.multi_lora import multi_lora_analysis
from loadlens.experiment.device import (
    DeviceWatch,
    ProbeSource,
    Reading,
    _delta,
    busy_figures,
    fragmentation_figures,
    reading_from_sim,
)
from loadlens.experiment.models import Analysis, ExperimentError, expand_adapters, expand_trials, parse_experiment
from tests.probe.fakes import MIB, FakeCuda, fake_torch, stats
from tests.sim.helpers import collect, make_engine, now, prompt_of, request, sample, write_adapter
from tests.support.paths import ROOT

BLOCK = 1_200_128  # 1 200 000 B rounded up to 512 B
ASKED = 1_200_000


def reading(reserved: int, allocated: int, requested: int, *, activations: int | None = None, **kw: Any) -> Reading:
    fields = {"active_bytes": allocated, "inactive_split_bytes": 0, "segments": 0, "alloc_retries": 0, "ooms": 0,
              "largest_free_block_bytes": None, "total_free_bytes": None, **kw}  # fmt: skip
    return Reading(AllocatorReading(reserved, allocated, requested_bytes=requested, **fields), activations, 0.0)


# --- VRAM steps and fragmentation -----------------------------------------------------------------------------


def test_a_step_takes_out_the_activations_and_splits_rounding_from_reserve() -> None:
    before = reading(100 * MIB, 60 * MIB, 50 * MIB, activations=4 * MIB)
    # 64 modules of 106 496 B asked, 2 MiB blocks taken; the activations grew by 1 MiB meanwhile.
    after = reading(228 * MIB, 60 * MIB + 128 * MIB + MIB, 50 * MIB + 64 * 106_496 + MIB, activations=5 * MIB)
    step = _delta(before, after)
    assert step == {
        "requested_bytes": 64 * 106_496.0,
        "allocated_bytes": 128.0 * MIB,
        "reserved_bytes": 128.0 * MIB,
        "rounding_overhead_bytes": 128.0 * MIB - 64 * 106_496,
        "rounding_overhead_ratio": (128 * MIB - 64 * 106_496) / (128 * MIB),
    }
    assert set(_delta(None, after).values()) == {None}


def test_fragmentation_figures() -> None:
    r = reading(40 * MIB, 30 * MIB, 30 * MIB, inactive_split_bytes=10 * MIB, largest_free_block_bytes=6 * MIB,
                total_free_bytes=10 * MIB)  # fmt: skip
    assert fragmentation_figures(r) == {
        "frag.free_block_ratio": pytest.approx(0.4),
        "frag.inactive_split_ratio": 0.25,
        "frag.reserved_bytes": 40.0 * MIB,
    }
    assert set(fragmentation_figures(None).values()) == {None}


def test_a_sim_document_reads_as_the_allocator_fields() -> None:
    alloc = {"reserved_bytes": 9, "allocated_bytes": 7, "active_bytes": 7, "inactive_split_bytes": 2,
             "requested_bytes": 5, "segments": 3, "alloc_retries": 0, "ooms": 0, "largest_free_block_bytes": 2,
             "total_free_bytes": 2}  # fmt: skip
    doc = {"timestamp_us": 1_700_000_000_000_000,
           "devices": [{"allocator": alloc, "memory_by_owner": {"activations": 4}}]}  # fmt: skip
    r = reading_from_sim(doc)
    assert r is not None and r.activations == 4 and r.at == 1_700_000_000.0
    assert (r.allocator.reserved_bytes, r.allocator.requested_bytes, r.allocator.rounding_overhead_bytes) == (9, 5, 2)
    assert reading_from_sim({"timestamp_us": 0, "devices": []}) is None


# --- the probe path -------------------------------------------------------------------------------------------


class FakeServer(BaseHTTPRequestHandler):
    """A serving process: ``/v1/models`` and 1-token completions; a completion for an adapter not yet resident
    allocates its 8 blocks in the fake allocator and records the load in the probe (as the vLLM plugin does)."""

    cuda: FakeCuda
    probe: Probe
    resident: list[str]

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send({"data": [{"id": "base"}, *({"id": n} for n in self.resident)]})
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        model = body["model"]
        if model != "base" and model not in self.resident:
            start = time.time()
            self.resident.append(model)
            n = len(self.resident)
            reserved = 20 * MIB * (1 if n * 8 <= 16 else 2)  # 16 blocks per 20 MiB segment
            self.cuda.device_stats[0] = stats(reserved, n * 8 * BLOCK, n * 8 * ASKED)
            self.probe.record_lora_load(model, 8, start, time.time(), on_demand=True, source="cpu_cache")
        self._send({"choices": [{"text": "x"}]})


@pytest.fixture
def probe_server(tmp_path: Path) -> Iterator[tuple[str, Path, Probe]]:
    cuda = FakeCuda({0: stats(0, 0, 0, **{"reserved_bytes.all.peak": 1})}, [])
    probe = Probe("vllm-worker", tmp_path, fake_torch(cuda), env={}, interval=5.0).start()
    handler = type("Handler", (FakeServer,), {"cuda": cuda, "probe": probe, "resident": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", tmp_path, probe
    finally:
        server.shutdown()
        probe.stop()


def test_adapter_steps_from_the_probe_documents(probe_server: tuple[str, Path, Probe]) -> None:
    url, directory, _ = probe_server
    session = DeviceWatch.start(DeviceWatch(directory, poll_interval=0.05), url, ("a1", "a2", "a3"))
    with session:
        pass
    assert session.errors == [] or all("HTTP 404" in e for e in session.errors)
    figures = session.figures([(0.0, time.time())])
    for name in ("a1", "a2", "a3"):
        assert figures[f"vram.{name}.requested_bytes"] == 8 * ASKED
        assert figures[f"vram.{name}.allocated_bytes"] == 8 * BLOCK
        assert figures[f"vram.{name}.rounding_overhead_bytes"] == 8 * (BLOCK - ASKED)
    # 20 MiB segment steps: the first adapter opens a segment, the second fits in it, the third opens another.
    assert [figures[f"vram.{n}.reserved_bytes"] for n in ("a1", "a2", "a3")] == [20.0 * MIB, 0.0, 20.0 * MIB]
    assert figures["vram.adapters_reserved_bytes"] == 40.0 * MIB
    assert figures["vram.rounding_overhead_bytes"] == 24.0 * (BLOCK - ASKED)
    assert figures["frag.reserved_bytes"] == 40.0 * MIB
    assert figures["util.mean_pct"] is None  # the probe has no utilisation; this server has no /sim/device-state


def test_a_probe_document_without_devices_gives_no_reading(tmp_path: Path) -> None:
    cuda = FakeCuda({}, [], available=False)
    probe = Probe("vllm-worker", tmp_path, fake_torch(cuda), env={}, interval=5.0)
    probe.write_now()
    assert ProbeSource(tmp_path).read() is None


# --- the experiment file ------------------------------------------------------------------------------------------


def _experiment(tmp_path: Path, **trial: Any) -> Any:
    doc = {
        "version": 1, "name": "m", "parameters": {"n": 3, "w": "70,20,10"},
        "adapters": [{"name": "t{i}", "count": "${n}", "rank": 8, "seed": 5}],
        "profiles": {"p": {"version": 1, "traffic": [{"adapters": "${adapter_mix}"}], "stages": []}},
        "trials": [{"name": "x", "profile": "p", "adapters": ["t{i}"], "adapter_count": "${n}", **trial}],
        "analysis": {"kind": "multi_lora"},
    }  # fmt: skip
    return parse_experiment(doc, tmp_path / "m.yaml")


def test_adapter_count_and_weights_expand(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, adapter_weights="{w}")
    assert [(a.name, a.seed) for a in expand_adapters(exp)] == [("t1", 5), ("t2", 6), ("t3", 7)]
    (trial,) = expand_trials(exp)
    assert trial.adapters == ("t1", "t2", "t3")
    assert trial.mix == (("t1", 70.0), ("t2", 20.0), ("t3", 10.0))
    (equal,) = expand_trials(_experiment(tmp_path))
    assert equal.mix == (("t1", 1.0), ("t2", 1.0), ("t3", 1.0))


@pytest.mark.parametrize(
    ("trial", "message"),
    [
        ({"adapter_weights": "70,30"}, "trials.0.adapter_weights: '70,30': give 3 positive weights, one per adapter"),
        ({"adapter_weights": "a,b,c"}, "trials.0.adapter_weights: 'a,b,c': give comma-separated numbers or 'equal'"),
        ({"adapter_count": 4}, "trials.0.adapters: no adapter 't4'"),
        ({"adapter_count": "${w}"}, "trials.0.adapter_count: ${w} must give a positive integer, got '70,20,10'"),
    ],
)
def test_bad_counts_and_weights_are_named(tmp_path: Path, trial: dict[str, Any], message: str) -> None:
    with pytest.raises(ExperimentError) as err:
        expand_trials(_experiment(tmp_path, **trial))
    assert message in str(err.value)


# --- the packaged experiment on the sim -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_multi_lora_on_the_sim(tmp_path: Path) -> None:
    """deepseek-r1-distill-llama-8b on an A100-80GB, 2 GPU slots, 6 s of closed-loop traffic per trial, 70/20/10
    over three adapters. Each rank-8 q_proj/v_proj adapter asks 32 layers x (8 (4096 + 4096) + 8 (4096 + 1024))
    x 2 B = 6 815 744 B in 64 modules, each rounded to a 2 MiB block: 128 MiB. The one-adapter trial leaves its
    blocks cached, so the three-adapter trial's first adapter reuses them (reserved +0); its third evicts the
    first from its slot in the step that loads it (allocated net 0, reserved +128 MiB). With three adapters in
    two slots every change of adapter is a swap whose activation stalls the compute stream: utilisation swings
    from 0 to ~95 % (one adapter: a few points; docs/sim-engine.md §4)."""
    argv = [sys.executable, "-m", "loadlens.cli", "experiment", "multi-lora", "--results", str(tmp_path),
            "--run-id", "ci", "--time-scale", "0.2", "--param", "weights=70,20,10"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    directory = tmp_path / "experiments" / "ci"
    result = parse_experiment_result(json.loads((directory / "experiment_result.json").read_text()))
    assert [t.status for t in result.trials] == ["done", "done"]
    for t in result.trials:  # each trial's traffic goes to its own adapters, every request answered
        assert {k.split(".")[1] for k in t.figures if k.startswith("models.")} == set(t.adapters)
        assert t.figures["error_ratio"].mean == 0.0
    tables = {t.name: t.rows for t in result.tables}
    mib2 = 2 * MIB
    steps = [(r["trial"], r["adapter"], r["requested_bytes"], r["allocated_bytes"], r["reserved_bytes"])
             for r in tables["vram_steps"]]  # fmt: skip
    asked = 32 * (8 * 8192 + 8 * 5120) * 2
    assert steps == [
        ("1-adapter", "lora1", asked, 64 * mib2, 64 * mib2),
        ("3-adapters", "lora1", asked, 64 * mib2, 0.0),
        ("3-adapters", "lora2", asked, 64 * mib2, 64 * mib2),
        ("3-adapters", "lora3", 0.0, 0.0, 64 * mib2),
    ]
    vram = {r["trial"]: r for r in tables["vram"]}
    assert (vram["1-adapter"]["allocated_mib"], vram["3-adapters"]["allocated_mib"]) == (128.0, 256.0)
    assert vram["1-adapter"]["overhead_ratio"] == round(1 - asked / (64 * mib2), 4)
    util = {r["tasks"]: r for r in tables["utilisation"]}
    # The busy timeline (the steps' kernel intervals) and the 10 ms samples are the same schedule, binned apart:
    # one run here read 91.58 / 91.60 % busy with 1 adapter and 70.83 / 70.84 % with 3.
    for row in util.values():
        assert row["busy_ratio_pct"] == pytest.approx(row["mean_pct"], abs=1.0)
    assert util[3]["busy_swing_pct"] > util[1]["busy_swing_pct"] + 40.0  # type: ignore[operator]
    assert util[1]["interval_ms"] == util[3]["interval_ms"] == 10.0
    assert util[3]["peak_to_trough_pct"] > util[1]["peak_to_trough_pct"] + 40.0  # type: ignore[operator]
    # The swing period is not asserted: the swaps' cycle (120 ms in unloaded runs here) stretches when the
    # machine starves the sim (null in a run beside another vLLM: docs/experiments.md, *multi-lora*).
    findings = {f.name: f.passed for f in result.findings}
    assert findings == {"more_adapter_memory": True, "larger_swing": True}
    done = {r["model"]: r["completed"] for r in tables["models"] if r["trial"] == "3-adapters"}
    assert done["lora1"] > done["lora2"] > done["lora3"] > 0  # type: ignore[operator]
    argv = [
        sys.executable,
        "-m",
        "loadlens.cli",
        "report",
        "--results",
        str(directory),
        "--prometheus",
        "http://127.0.0.1:9",
    ]
    report = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert report.returncode == 0, report.stderr
    page = (directory / "report" / "index.html").read_text()
    assert "GPU utilisation during the measured load" in page and "VRAM step per adapter" in page


def _trial(i: int, names: list[str], figures: dict[str, float | None]) -> Trial:
    stats = {k: Stat(mean=v, n=1, values=[v]) for k, v in figures.items()}
    return Trial(index=i, name=f"t{i}", profile="p", adapters=names, status="done", figures=stats)


def test_the_analysis_compares_the_fewest_adapters_with_the_most() -> None:
    one = _trial(0, ["a"], {"vram.adapters_allocated_bytes": 1.0, "util.peak_to_trough_pct": 5.0})
    many = _trial(1, ["a", "b"], {"vram.adapters_allocated_bytes": 2.0, "util.peak_to_trough_pct": None})
    doc = ExperimentResult(
        schema="loadlens.experiment_result", run_id="x", start_time="2026-01-01T00:00:00Z",
        experiment=ExperimentInfo(name="m", source="m.yaml", sha256="", repeats=1, time_scale=1, users_scale=1,
                                  analysis="multi_lora"),
        server=ServerInfo(mode="urls"), trials=[many, one],
    )  # fmt: skip
    multi_lora_analysis(Analysis(kind="multi_lora"), doc, load_slos(None))
    assert [(f.name, f.passed) for f in doc.findings] == [("more_adapter_memory", True), ("larger_swing", None)]
    assert "utilisation is null" in doc.findings[1].detail
    steps = [(r["trial"], r["step"], r["adapter"]) for r in doc.tables[2].rows]
    assert steps == [("t1", 1, "a"), ("t1", 2, "b"), ("t0", 1, "a")]
    doc.trials = [one, _trial(2, ["b"], {})]
    multi_lora_analysis(Analysis(kind="multi_lora"), doc, load_slos(None))
    assert [(f.name, f.passed) for f in doc.findings] == [("compared", None)]


@pytest.mark.parametrize(("adapters", "slots", "swaps"), [(1, 2, False), (3, 2, True), (3, 3, False)])
def test_the_sim_swings_only_when_adapters_share_slots(tmp_path: Path, adapters: int, slots: int, swaps: bool) -> None:
    """What the experiment's default (`slots` 2) rests on, in modeled time (no machine in it): six closed-loop
    clients of 6-token requests over 1.5 s. Three adapters in two GPU slots swap on many changes of adapter and
    each activation idles the GPU (mean 67.7 %, 14 idle samples of 100, 21 loads); in three slots (or one adapter
    in two) each is read once and activated once and the GPU stays busy (91.8 %, 91.5 %; no idle sample)."""

    async def body() -> tuple[float, int, int]:
        engine, reg = make_engine("deepseek-r1-distill-llama-8b", "a100-80gb-sxm", speed=1.0)
        await engine.start()
        await engine.set_knobs({"max_loras": slots})
        loras = [LoRARequest(f"t{i}", i + 1, str(write_adapter(tmp_path, f"t{i}"))) for i in range(adapters)]
        for lora in loras:
            await engine.load_adapter(lora)
        stop_at = now() + 1.5

        async def client(k: int) -> None:
            i = k
            while now() < stop_at:
                lora = loras[i % adapters]
                await collect(await engine.generate(request(f"c{k}-{i}", prompt_of(30, k), lora=lora, max_tokens=6)))
                i += 1

        await asyncio.gather(*(client(k) for k in range(6)))
        util = [s["gpu_percent"] for s in engine.device_state(0)["devices"][0]["util_samples"]][-100:]
        await engine.stop()
        # Each adapter is read once when loaded (storage) and activated once (host), unless it is swapped out.
        loads = sum(int(sample(reg, "loadlens_sim_adapter_load_seconds_count", source=s)) for s in ("host", "storage"))
        return sum(util) / len(util), sum(1 for u in util if u == 0.0), loads

    mean, idle, loads = run_virtual(body())
    if swaps:
        assert loads > 4 * adapters and idle > 5 and mean < 80.0
    else:
        assert loads == 2 * adapters and idle == 0 and mean > 85.0


def test_busy_figures_average_the_timeline_over_the_measured_windows() -> None:
    # 29 ms steps busy 14 ms for 4 s, measured in two 2 s windows; then a window after the last step.
    steps = [(k * 0.029, k * 0.029 + 0.014) for k in range(138)]
    got = busy_figures(steps, [(0.0, 2.0), (2.0, 4.0)])
    assert got["busy.ratio_pct"] == pytest.approx(100 * 14 / 29, abs=1.0)
    assert got["busy.period_ms"] == pytest.approx(29.0, abs=1.0)
    assert got["busy.run_p50_ms"] == pytest.approx(14.0, abs=1e-6)
    assert got["busy.gap_max_ms"] == pytest.approx(15.0, abs=1e-6)
    assert got["busy.resolution_ms"] == 1.0
    idle = busy_figures(steps, [(10.0, 11.0)])
    assert (idle["busy.ratio_pct"], idle["busy.period_ms"], idle["busy.gap_p50_ms"]) == (0.0, None, None)
    assert set(busy_figures([], [(0.0, 1.0)]).values()) == {None}  # no timeline: all null
