"""Run in a subprocess by the tests: a fake vLLM first on sys.path, the plugin loaded by vLLM's plugin loader
(the real entry point), then what a GPU worker does. Prints one JSON document: records, log lines, results.

argv: <fake vllm root> <options JSON>. Options: probe_raises, register_twice, preimport, real_probe_dir, no_cuda
(the real probe's fake torch has no CUDA), cpu_worker (vLLM's CPU worker), init_args (for init_device), v2_runner
(the second model runner, as the fake was written with it: its profiling capture runs first)."""

from __future__ import annotations

import importlib
import json
import logging
import sys
import types
from pathlib import Path
from typing import Any

root, options = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, root)

logs: list[str] = []


class _Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        logs.append(f"{record.levelname} {record.getMessage()}")


logging.getLogger("loadlens").addHandler(_Collect())
logging.getLogger("loadlens").setLevel(logging.INFO)

records: list[list[Any]] = []
roles: list[str] = []


class FakeProbe:
    def record_lora_load(
        self, adapter: str, rank: int | None, start: float, end: float, *, on_demand: bool, source: str = "storage"
    ) -> None:
        if options.get("probe_raises"):
            raise RuntimeError("probe is broken")
        records.append(["lora", adapter, rank, start, end, on_demand, source])

    def record_cuda_graph_capture(self, seconds: float) -> None:
        if options.get("probe_raises"):
            raise RuntimeError("probe is broken")
        records.append(["capture", seconds])

    def busy_timeline(self, source: str) -> FakeTimeline:
        return FakeTimeline(source)


class FakeTimeline:
    """The busy timeline's begin/end, on the driver's clock."""

    def __init__(self, source: str) -> None:
        self.source = source

    def begin(self) -> float:
        if options.get("probe_raises"):
            raise RuntimeError("probe is broken")
        return clock.t

    def end(self, token: float) -> None:
        records.append(["busy", self.source, token, clock.t])


class Clock:
    t = 0.0

    def advance(self, seconds: float) -> None:
        self.t += seconds


if options.get("preimport"):
    import vllm.v1.worker.gpu_worker  # imported before the plugins are loaded

import vllm  # noqa: E402
import vllm.plugins  # noqa: E402

vllm.plugins.load_general_plugins()
if options.get("register_twice"):
    vllm.plugins.plugins_loaded = False  # a second load in the same process, as a re-exec might do
    vllm.plugins.load_general_plugins()

from exporters.vllm_plugin.state import STATE  # noqa: E402

clock = Clock()
vllm.TICK = clock.advance
STATE.wall = lambda: 1000.0 + clock.t
STATE.mono = lambda: clock.t
probes: list[Any] = []
if options.get("real_probe_dir"):
    # The real probe (exporters.probe) over the probe tests' fake torch: what a GPU worker would write.
    sys.path.insert(1, str(Path(__file__).resolve().parents[2]))
    from exporters.probe import start_probe
    from tests.probe.fakes import FakeCuda, fake_torch, stats

    def _start_real(role: str) -> Any:
        roles.append(role)
        cuda = FakeCuda({0: stats(2**30, 2**29, 2**29)}, [], available=not options.get("no_cuda"))
        probes.append(start_probe(role, directory=options["real_probe_dir"], torch=fake_torch(cuda)))
        return probes[-1]

    STATE.starter = _start_real
else:

    def _start(role: str) -> FakeProbe:
        roles.append(role)
        return FakeProbe()

    STATE.starter = _start

from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.v1.worker.gpu_worker import Worker  # noqa: E402

if options.get("cpu_worker"):  # vLLM's CPU build: its worker replaces init_device
    from vllm.v1.worker.cpu_worker import CPUWorker as Worker  # type: ignore[assignment]

results: dict[str, Any] = {}
worker = Worker({"/a/sql": 8, "/a/chat": 16})
results["init_device"] = worker.init_device(*options.get("init_args", []))
results["explicit"] = worker.add_lora(LoRARequest("sql", 1, "/a/sql"))  # add_lora RPC: not on demand
clock.advance(10.0)
batch = {LoRARequest("sql", 1, "/a/sql"), LoRARequest("chat", 2, "/a/chat")}
# chat loads on demand, sql is resident; the mappings are per prompt and per token, as vLLM's runner passes them
results["batch"] = worker.model_runner._set_active_loras((1, 2), (1, 1, 2), batch)
results["mapping"] = worker.model_runner.lora_manager._adapter_manager._last_mapping
clock.advance(10.0)
# vLLM gives sql's GPU slot away (more adapters than max_loras); a later batch names sql again: it comes back
# from the CPU cache (slot copy 0.125 s, no read), and chat, still resident, is no load.
results["evicted"] = worker.model_runner.lora_manager._adapter_manager.deactivate_adapter(1)
results["batch_again"] = worker.model_runner._set_active_loras((1, 2), (1, 1, 2), batch)
clock.advance(10.0)
if options.get("v2_runner"):
    # vLLM 0.32 sizes the graphs' memory first (gpu/cudagraph_utils.py): the second runner's capture with
    # profile_only=True, a measurement and not the capture; the plugin must not record it.
    results["profile_capture"] = worker.model_runner.capture_model(profile_only=True)
results["capture"] = worker.compile_or_warm_up_model()
clock.advance(1.0)
results["execute"] = worker.model_runner.execute_model("step-1")  # one engine step: forward, then sampling
results["sample"] = worker.model_runner.sample_tokens("grammar-1")
# a step with nothing scheduled (vLLM frees a finished request's state): no forward, not timed
results["empty"] = worker.model_runner.execute_model(types.SimpleNamespace(total_num_scheduled_tokens=0))
try:
    worker.add_lora(LoRARequest("missing", 3, "/nope"))
except ValueError as exc:
    manager = importlib.import_module("vllm.lora.worker_manager")
    results["error_is_vllms"] = exc is manager.LAST_ERROR
    results["error"] = str(exc)

patched: dict[str, Any] = {}
modules = {
    "Worker": "vllm.v1.worker.gpu_worker",
    "GPUModelRunner": "vllm.v1.worker." + ("gpu.model_runner" if options.get("v2_runner") else "gpu_model_runner"),
    "LRUCacheWorkerLoRAManager": "vllm.lora.worker_manager",
}
for qualname in (
    "Worker.init_device",
    "GPUModelRunner.capture_model",
    "GPUModelRunner.execute_model",
    "GPUModelRunner.sample_tokens",
    "LRUCacheWorkerLoRAManager.add_adapter",
    "LRUCacheWorkerLoRAManager._load_adapter",
    "LRUCacheWorkerLoRAManager.set_active_adapters",
):
    cls_name, _, method = qualname.partition(".")
    func = getattr(getattr(importlib.import_module(modules[cls_name]), cls_name), method, None)
    inner = getattr(func, "__wrapped__", None)
    patched[qualname] = [bool(getattr(func, "__loadlens_hook__", False)), bool(getattr(inner, "__loadlens_hook__", 0))]

document = None
busy = None
if probes:
    probes[0].write_now()
    written = json.loads(probes[0].path.read_text())
    document = written["events"]
    if written["busy"] is not None:
        busy = {k: written["busy"][k] for k in ("source", "clock", "intervals_total")}
    probes[0].stop()

finders = [type(f).__name__ for f in sys.meta_path if type(f).__module__.startswith("exporters")]
print(
    json.dumps(
        {
            "records": records,
            "roles": roles,
            "logs": logs,
            "results": results,
            "patched": patched,
            "finders": finders,
            "document": document,
            "busy": busy,
        }
    )
)
