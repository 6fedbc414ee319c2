"""``register()``: the function vLLM's ``load_general_plugins`` calls, with no arguments, in every process.

It must be cheap, idempotent and never raise: inert unless ``LOADLENS_VLLM_PROBE=1``; otherwise it arranges
the hooks (hooks.py) to apply when vLLM imports the modules they patch. The probe itself starts only in a
worker, when vLLM calls its ``init_device`` there (GPU or CPU worker; hooks.py, ``worker_probe``)."""

from __future__ import annotations

import logging
import os
from functools import partial
from types import ModuleType

from exporters.vllm_plugin import hooks
from exporters.vllm_plugin.imports import when_imported
from exporters.vllm_plugin.state import LOG

ENV_ENABLE = "LOADLENS_VLLM_PROBE"
_TRUE = {"1", "true", "yes", "on"}
_registered = False


def enabled() -> bool:
    return os.environ.get(ENV_ENABLE, "").strip().lower() in _TRUE


def _apply_all(module_hooks: tuple[hooks.Hook, ...], module: ModuleType) -> None:
    for hook in module_hooks:
        hooks.apply(hook, module)


def _log_to_stderr() -> None:
    """vLLM configures its own ``vllm`` logger only: without a handler of ours, Python would print our warnings
    alone (its last-resort handler) and drop the start-up lines saying which hooks applied."""
    if LOG.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [pid %(process)d] %(message)s"))
    LOG.addHandler(handler)
    if LOG.level == logging.NOTSET:
        LOG.setLevel(logging.INFO)


def register() -> None:
    """vLLM's general-plugin entry point (``vllm.general_plugins: loadlens``)."""
    global _registered
    try:
        if _registered or not enabled():
            return
        _registered = True
        _log_to_stderr()
        by_module: dict[str, tuple[hooks.Hook, ...]] = {}
        for hook in hooks.HOOKS:
            by_module[hook.module] = (*by_module.get(hook.module, ()), hook)
        when_imported({name: partial(_apply_all, group) for name, group in by_module.items()})
    except Exception as exc:  # vLLM calls us outside its own try: nothing may escape
        LOG.warning("loadlens vllm plugin: register failed (%s: %s); vLLM runs without it", type(exc).__name__, exc)
