"""Run a callback right after a named module is imported, without importing it ourselves.

vLLM loads general plugins before it imports its worker (torch, CUDA), so the plugin cannot patch the worker
at load time without making every process pay for it. This finder sits first in ``sys.meta_path``, lets the
other finders locate a target module, and wraps that module's ``exec_module`` so the callback runs once the
module's code has run. It removes itself when every target has been seen."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from exporters.vllm_plugin.state import LOG

Callback = Callable[[ModuleType], None]


class PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, targets: dict[str, Callback]) -> None:
        self.targets = dict(targets)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        callback = self.targets.get(fullname)
        if callback is None:
            return None
        spec = self._spec_from_others(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        original = getattr(loader, "exec_module", None)
        if original is None:
            return spec

        def exec_module(module: ModuleType) -> None:
            original(module)  # vLLM's module, unchanged; an exception from it propagates as usual
            self._fire(fullname, module)

        try:
            loader.exec_module = exec_module  # one loader per module file: only this module is affected
        except (AttributeError, TypeError) as exc:
            LOG.warning(
                "loadlens vllm plugin: cannot watch the import of %s (%s); its hooks do not apply", fullname, exc
            )
        return spec

    def _spec_from_others(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> ModuleSpec | None:
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def _fire(self, fullname: str, module: ModuleType) -> None:
        callback = self.targets.pop(fullname, None)
        if not self.targets:
            uninstall(self)
        if callback is None:
            return
        try:
            callback(module)
        except Exception as exc:
            LOG.warning(
                "loadlens vllm plugin: hooks for %s failed to apply (%s: %s)", fullname, type(exc).__name__, exc
            )


def pending_modules() -> set[str]:
    """Modules the installed finders still wait for."""
    return {name for f in sys.meta_path if isinstance(f, PostImportFinder) for name in f.targets}


def uninstall(finder: PostImportFinder) -> None:
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)


def when_imported(targets: dict[str, Callback]) -> PostImportFinder | None:
    """Call each callback with its module: now for a module already imported, else right after its import."""
    pending: dict[str, Callback] = {}
    for name, callback in targets.items():
        module = sys.modules.get(name)
        if module is None:
            pending[name] = callback
            continue
        try:
            callback(module)
        except Exception as exc:
            LOG.warning("loadlens vllm plugin: hooks for %s failed to apply (%s: %s)", name, type(exc).__name__, exc)
    if not pending:
        return None
    finder = PostImportFinder(pending)
    sys.meta_path.insert(0, finder)
    return finder
