"""In-process allocator probe: publishes what only a GPU-owning PyTorch process can see (docs/probe-documents.md),
and the events its callers record (LoRA loads), in a process without CUDA too.

::

    from exporters.probe import start_probe
    probe = start_probe("vllm-worker")        # None when LOADLENS_PROBE_DIR is unset or torch is missing
    if probe is not None:
        probe.record_lora_load("sql-lora", 16, t0, t1, on_demand=True)
        probe.record_cuda_graph_capture(4.2)
        probe.stop()                          # removes this process's document

It may import only itself, ``loadlens.contracts`` and ``loadlens.util`` (docs/architecture.md): the GPU
exporter reads the documents from the shared directory, never through an import.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

from exporters.probe.probe import DEFAULT_INTERVAL, DEFAULT_SNAPSHOT_INTERVAL, Probe
from loadlens.contracts.probe_document import ROLE_PATTERN, valid_role

__all__ = ["ENV_DIR", "ENV_INTERVAL", "ENV_SNAPSHOT_INTERVAL", "Probe", "start_probe"]

log = logging.getLogger(__name__)

ENV_DIR = "LOADLENS_PROBE_DIR"
ENV_INTERVAL = "LOADLENS_PROBE_INTERVAL"
ENV_SNAPSHOT_INTERVAL = "LOADLENS_PROBE_SNAPSHOT_INTERVAL"


def _seconds(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        log.warning("loadlens probe: %s=%r is not a positive number of seconds; using %s", name, text, default)
        return default
    return value


def start_probe(role: str, *, directory: str | os.PathLike[str] | None = None, torch: Any = None) -> Probe | None:
    """Start the probe thread and publish the first document; None (one log line) when it cannot run.

    ``directory`` defaults to ``$LOADLENS_PROBE_DIR``; unset or empty disables the probe. Without CUDA the
    probe runs and its document has no devices, only the events its callers record. Never raises.
    """
    try:
        if directory is None:
            directory = os.environ.get(ENV_DIR) or None
        if directory is None:
            log.info("loadlens probe: disabled (%s is not set)", ENV_DIR)
            return None
        if not valid_role(role):
            log.warning("loadlens probe: disabled: role %r must match %s", role, ROLE_PATTERN.pattern)
            return None
        if torch is None:
            try:
                torch = importlib.import_module("torch")
            except Exception as err:  # ImportError, or a broken CUDA install raising OSError
                log.info("loadlens probe: disabled (torch unavailable: %s)", err)
                return None
        probe = Probe(
            role,
            directory,
            torch,
            interval=_seconds(ENV_INTERVAL, DEFAULT_INTERVAL),
            snapshot_interval=_seconds(ENV_SNAPSHOT_INTERVAL, DEFAULT_SNAPSHOT_INTERVAL),
        ).start()
    except Exception as err:
        log.warning("loadlens probe: disabled (%s: %s)", type(err).__name__, err)
        return None
    log.info(
        "loadlens probe: role %s writing %s every %.3g s%s",
        role,
        probe.path,
        probe.interval,
        "" if probe.has_cuda else " (no CUDA: events only, no devices)",
    )
    return probe
