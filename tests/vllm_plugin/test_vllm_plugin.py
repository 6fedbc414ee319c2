"""The vLLM general plugin: found through the real entry-point mechanism, and its hooks against a fake vLLM
shaped like the real modules (vLLM itself cannot run here), including vLLMs whose internals differ."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import ROOT
from tests.vllm_plugin import fake_vllm

DRIVER = Path(__file__).with_name("driver.py")
METHODS = (
    "Worker.init_device",
    "GPUModelRunner.capture_model",
    "GPUModelRunner.execute_model",
    "GPUModelRunner.sample_tokens",
    "LRUCacheWorkerLoRAManager.add_adapter",
    "LRUCacheWorkerLoRAManager._load_adapter",
    "LRUCacheWorkerLoRAManager.set_active_adapters",
)
# What the fake worker does, timed by its fake clock: sql read (0.25 s) + slot copy (0.125 s) at t=0 by the
# add_lora RPC; chat the same at t=10.375 while a batch is prepared (sql already resident: no load); sql's slot
# is given away and the next batch at t=20.75 brings it back from the CPU cache (slot copy only, 0.125 s; chat
# resident: no load); capture 2 s.
EXPECTED_RECORDS = [
    ["lora", "sql", 8, 1000.0, 1000.375, False, "storage"],
    ["lora", "chat", 16, 1010.375, 1010.75, True, "storage"],
    ["lora", "sql", 8, 1020.75, 1020.875, True, "cpu_cache"],
    ["capture", 2.0],
    # one engine step at t=33.875: execute_model (3 ms), then sample_tokens (1 ms), each one busy interval
    ["busy", "vllm_execute_model", 33.875, 33.878],
    ["busy", "vllm_execute_model", 33.878, 33.879],
]
VLLM_RESULTS = {
    "init_device": None,
    "explicit": True,
    "batch": None,
    "evicted": True,
    "batch_again": None,
    "mapping": [[1, 1, 2], [1, 2]],  # what the model manager was handed: (per token, per prompt)
    "capture": 4096,
    "execute": None,
    "sample": ["sampled", "grammar-1"],
    "empty": None,
    "error_is_vllms": True,
    "error": "Loading lora missing failed: No adapter found",
}


def _run(fake: Path, enabled: bool = True, **options: Any) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOADLENS_VLLM_PROBE", "VLLM_PLUGINS")}
    if enabled:
        env["LOADLENS_VLLM_PROBE"] = "1"
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(fake), json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_the_entry_point_is_registered_for_vllm() -> None:
    (plugin,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "loadlens"]
    assert plugin.value == "exporters.vllm_plugin:register"


def test_loaded_and_called_with_the_variable_unset_it_does_nothing() -> None:
    """What vLLM does (load the entry point, call it with no arguments) leaves no trace without the variable."""
    code = (
        "import sys\n"
        "from importlib.metadata import entry_points\n"
        "(ep,) = [e for e in entry_points(group='vllm.general_plugins') if e.name == 'loadlens']\n"
        "before = list(sys.meta_path)\n"
        "print(ep.load()(), sys.meta_path == before, sorted(m for m in sys.modules if m.split('.')[0] in "
        "('vllm', 'torch', 'exporters') and not m.startswith('exporters.vllm_plugin') and m != 'exporters'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LOADLENS_VLLM_PROBE"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None True []"


def test_hooks_record_exact_values_and_vllm_results_are_unchanged(tmp_path: Path) -> None:
    out = _run(fake_vllm.write(tmp_path))
    assert out["records"] == EXPECTED_RECORDS
    assert out["roles"] == ["vllm-worker"]  # the probe started once, in init_device
    assert out["results"] == VLLM_RESULTS  # return values, and vLLM's own exception object, pass through
    assert out["patched"] == {m: [True, False] for m in METHODS}
    # The import watcher still waits for the second model runner's module and the CPU worker's, which this
    # vLLM never imported; once the worker has its device, one line says so for each.
    assert out["finders"] == ["PostImportFinder"]
    assert out["logs"] == [
        "INFO loadlens vllm plugin: hook lora_load applied to vllm.lora.worker_manager (vLLM 0.33.0)",
        "INFO loadlens vllm plugin: hook cuda_graph_capture applied to vllm.v1.worker.gpu_model_runner (vLLM 0.33.0)",
        "INFO loadlens vllm plugin: hook busy_timeline applied to vllm.v1.worker.gpu_model_runner (vLLM 0.33.0)",
        "INFO loadlens vllm plugin: hook worker_probe applied to vllm.v1.worker.gpu_worker (vLLM 0.33.0)",
        "INFO loadlens vllm plugin: probe started in worker process (CUDA)",
        *(
            f"INFO loadlens vllm plugin: hook {hook} not applied yet: {module} not imported by this worker (vLLM does "
            "not use it here); applied if it is imported later"
            for hook, module in (
                ("worker_probe", "vllm.v1.worker.cpu_worker"),
                ("cuda_graph_capture", "vllm.v1.worker.gpu.model_runner"),
                ("busy_timeline", "vllm.v1.worker.gpu.model_runner"),
            )
        ),
    ]


def test_disabled_in_vllm_nothing_is_patched(tmp_path: Path) -> None:
    out = _run(fake_vllm.write(tmp_path), enabled=False)
    assert out["records"] == [] and out["logs"] == [] and out["roles"] == []
    assert out["results"] == VLLM_RESULTS
    assert out["patched"] == {m: [False, False] for m in METHODS}


@pytest.mark.parametrize(
    ("version", "why"),
    [
        ("0.7.3", "version outside the supported range >=0.8,<0.34"),
        ("1.2.0", "version outside the supported range >=0.8,<0.34"),
        ("dev", "vllm.__version__ 'dev' cannot be parsed"),
    ],
)
def test_an_unsupported_version_patches_nothing_and_says_why(tmp_path: Path, version: str, why: str) -> None:
    out = _run(fake_vllm.write(tmp_path, version))
    assert out["patched"] == {m: [False, False] for m in METHODS}
    assert out["records"] == [] and out["roles"] == []
    assert out["results"] == VLLM_RESULTS
    assert out["logs"] == [
        f"WARNING loadlens vllm plugin: hook {hook} not applied (vLLM {version}): {why}"
        for hook in ("lora_load", "cuda_graph_capture", "busy_timeline", "worker_probe")
    ]


def test_a_renamed_method_refuses_only_its_hook(tmp_path: Path) -> None:
    out = _run(fake_vllm.write(tmp_path, capture_method="capture_graphs"))
    assert (
        "WARNING loadlens vllm plugin: hook cuda_graph_capture not applied (vLLM 0.33.0): "
        "vllm.v1.worker.gpu_model_runner.GPUModelRunner.capture_model not found"
    ) in out["logs"]
    assert out["patched"]["GPUModelRunner.capture_model"] == [False, False]  # absent, nothing was added
    assert out["patched"]["LRUCacheWorkerLoRAManager.add_adapter"] == [True, False]
    assert out["records"] == EXPECTED_RECORDS[:3] + EXPECTED_RECORDS[4:]  # no capture record; the others still
    assert out["results"] == VLLM_RESULTS


def test_another_signature_refuses_the_whole_hook(tmp_path: Path) -> None:
    out = _run(fake_vllm.write(tmp_path, add_adapter_params="self, *requests"))
    assert (
        "WARNING loadlens vllm plugin: hook lora_load not applied (vLLM 0.33.0): "
        "vllm.lora.worker_manager.LRUCacheWorkerLoRAManager.add_adapter(self, requests) "
        "does not take 1 argument(s) besides self"
    ) in out["logs"]
    lora_methods = [m for m in METHODS if m.startswith("LRUCache")]
    assert all(out["patched"][m] == [False, False] for m in lora_methods)  # all of the hook or none of it
    assert out["records"] == EXPECTED_RECORDS[3:]  # capture and the step


def test_a_failing_probe_never_breaks_vllm(tmp_path: Path) -> None:
    out = _run(fake_vllm.write(tmp_path), probe_raises=True)
    assert out["results"] == VLLM_RESULTS
    assert out["records"] == []
    failures = [line for line in out["logs"] if "failed while recording" in line]
    assert failures == [  # one line per hook, however often it fails
        "WARNING loadlens vllm plugin: hook lora_load failed while recording (RuntimeError: probe is broken); "
        "vLLM continues, further failures of this hook are not logged",
        "WARNING loadlens vllm plugin: hook cuda_graph_capture failed while recording (RuntimeError: probe is "
        "broken); vLLM continues, further failures of this hook are not logged",
        "WARNING loadlens vllm plugin: hook busy_timeline failed while recording (RuntimeError: probe is broken); "
        "vLLM continues, further failures of this hook are not logged",
    ]


@pytest.mark.parametrize("preimport", [False, True], ids=["lazy", "already-imported"])
def test_registered_twice_patches_once(tmp_path: Path, preimport: bool) -> None:
    out = _run(fake_vllm.write(tmp_path), register_twice=True, preimport=preimport)
    assert out["patched"] == {m: [True, False] for m in METHODS}  # a wrapper never wraps a wrapper
    assert out["records"] == EXPECTED_RECORDS
    assert sum("hook lora_load applied" in line for line in out["logs"]) == 1


def test_the_real_probe_receives_the_records(tmp_path: Path) -> None:
    """The same worker with exporters.probe itself (over the probe tests' fake torch): its document holds them."""
    out = _run(fake_vllm.write(tmp_path / "fake"), real_probe_dir=str(tmp_path / "probe"))
    assert out["results"] == VLLM_RESULTS
    assert out["roles"] == ["vllm-worker"]
    events = out["document"]
    assert events["lora_loads"] == [
        {"adapter": "sql", "rank": 8, "start": 1000.0, "end": 1000.375, "on_demand": False, "source": "storage"},
        {"adapter": "chat", "rank": 16, "start": 1010.375, "end": 1010.75, "on_demand": True, "source": "storage"},
        {"adapter": "sql", "rank": 8, "start": 1020.75, "end": 1020.875, "on_demand": True, "source": "cpu_cache"},
    ]
    assert (events["lora_loads_total"], events["lora_on_demand_loads_total"]) == (3, 2)
    assert events["cuda_graph_capture_seconds"] == 2.0
    # The step's two calls, timed with (fake) CUDA events: one busy interval each.
    assert out["busy"] == {"source": "vllm_execute_model", "clock": "cuda_event", "intervals_total": 2}
    assert not list((tmp_path / "probe").glob("*.json"))  # stop() removed the document


def test_the_second_model_runner_is_hooked_when_vllm_uses_it(tmp_path: Path) -> None:
    out = _run(fake_vllm.write(tmp_path, v2_runner=True), v2_runner=True)
    # one capture: the profiling run before it (2 s more on the clock) is not recorded
    step = [["busy", "vllm_execute_model", 35.875, 35.878], ["busy", "vllm_execute_model", 35.878, 35.879]]
    assert out["records"] == EXPECTED_RECORDS[:4] + step
    assert out["results"] == {**VLLM_RESULTS, "profile_capture": VLLM_RESULTS["capture"]}
    assert out["patched"]["GPUModelRunner.capture_model"] == [True, False]
    assert (
        "INFO loadlens vllm plugin: hook cuda_graph_capture applied to vllm.v1.worker.gpu.model_runner (vLLM 0.33.0)"
    ) in out["logs"]
    assert (
        "INFO loadlens vllm plugin: hook busy_timeline applied to vllm.v1.worker.gpu.model_runner (vLLM 0.33.0)"
    ) in out["logs"]
    assert out["finders"] == ["PostImportFinder"]  # it still waits for the CPU worker's module only
    assert [line for line in out["logs"] if "not applied yet" in line] == [
        "INFO loadlens vllm plugin: hook worker_probe not applied yet: vllm.v1.worker.cpu_worker not imported by this "
        "worker (vLLM does not use it here); applied if it is imported later"
    ]


def test_without_the_slot_table_reactivations_are_not_guessed(tmp_path: Path) -> None:
    # A vLLM whose model manager keeps its GPU slots under another name: reads are still recorded; a move from
    # the CPU cache cannot be told from a no-op activation, so none is recorded rather than a wrong one.
    out = _run(fake_vllm.write(tmp_path, active_attr="_slots"))
    assert out["records"] == [EXPECTED_RECORDS[0], EXPECTED_RECORDS[1], *EXPECTED_RECORDS[3:]]
    assert out["results"] == VLLM_RESULTS


def test_the_cpu_worker_starts_the_probe_and_its_document_has_no_devices(tmp_path: Path) -> None:
    """vLLM's CPU build: its worker's own init_device starts the probe; without CUDA the real probe's document
    has the worker's LoRA loads and no devices."""
    out = _run(fake_vllm.write(tmp_path / "fake"), cpu_worker=True, no_cuda=True, real_probe_dir=str(tmp_path / "p"))
    assert out["results"] == VLLM_RESULTS
    assert out["roles"] == ["vllm-worker"]
    assert out["finders"] == ["PostImportFinder"]  # the second runner's module only
    assert out["logs"] == [
        "INFO loadlens vllm plugin: hook lora_load applied to vllm.lora.worker_manager (vLLM 0.33.0)",
        "INFO loadlens vllm plugin: hook cuda_graph_capture applied to vllm.v1.worker.gpu_model_runner (vLLM 0.33.0)",
        "INFO loadlens vllm plugin: hook busy_timeline applied to vllm.v1.worker.gpu_model_runner (vLLM 0.33.0)",
        "INFO loadlens vllm plugin: hook worker_probe applied to vllm.v1.worker.gpu_worker (vLLM 0.33.0)",
        "INFO loadlens vllm plugin: hook worker_probe applied to vllm.v1.worker.cpu_worker (vLLM 0.33.0)",
        "INFO loadlens vllm plugin: probe started in worker process (no CUDA)",
        "INFO loadlens vllm plugin: hook cuda_graph_capture not applied yet: vllm.v1.worker.gpu.model_runner not "
        "imported by this worker (vLLM does not use it here); applied if it is imported later",
        "INFO loadlens vllm plugin: hook busy_timeline not applied yet: vllm.v1.worker.gpu.model_runner not "
        "imported by this worker (vLLM does not use it here); applied if it is imported later",
    ]
    # The step's two calls, timed on the host (no CUDA): one busy interval each.
    assert out["busy"] == {"source": "vllm_execute_model", "clock": "perf_counter", "intervals_total": 2}
    events = out["document"]
    assert [(e["adapter"], e["on_demand"], e["source"]) for e in events["lora_loads"]] == [
        ("sql", False, "storage"),
        ("chat", True, "storage"),
        ("sql", True, "cpu_cache"),
    ]
    assert events["cuda_graph_capture_seconds"] == 2.0  # the fake CPU worker runs the GPU runner's capture


def test_a_cpu_worker_of_another_shape_is_refused_in_one_line_and_vllm_still_serves(tmp_path: Path) -> None:
    """A vLLM whose CPU worker's init_device takes an argument: that hook is refused with one warning, nothing
    crashes, every vLLM call answers as before, and the other hooks still apply (no probe: nothing recorded)."""
    out = _run(fake_vllm.write(tmp_path, cpu_init_params="self, device_config"), cpu_worker=True, init_args=["cfg"])
    warnings = [line for line in out["logs"] if line.startswith("WARNING")]
    assert warnings == [
        "WARNING loadlens vllm plugin: hook worker_probe not applied (vLLM 0.33.0): "
        "vllm.v1.worker.cpu_worker.CPUWorker.init_device(self, device_config) does not take 0 argument(s) besides self"
    ]
    assert out["results"] == VLLM_RESULTS
    assert out["roles"] == [] and out["records"] == []
    # lora_load, capture, busy_timeline, the GPU worker's probe
    assert sum(" applied to " in line for line in out["logs"]) == 4
