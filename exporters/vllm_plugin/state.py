"""Per-process state the wrappers read: the probe (only a worker has one), the clocks, the on-demand flag.

The wrappers check ``STATE.probe`` first, so a process without a probe pays one attribute read per call."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

LOG = logging.getLogger("loadlens.vllm_plugin")
WORKER_ROLE = "vllm-worker"
BUSY_SOURCE = "vllm_execute_model"
"""The busy timeline's source in a vLLM worker: the model runner's execute_model and sample_tokens calls."""


class ProbeLike(Protocol):
    """What the hooks call on ``exporters.probe.Probe``."""

    def record_lora_load(
        self, adapter: str, rank: int | None, start: float, end: float, *, on_demand: bool, source: str = "storage"
    ) -> None:
        """One adapter put into a GPU slot between ``start`` and ``end`` (epoch seconds): read from ``storage``,
        or moved from vLLM's CPU cache (``cpu_cache``)."""

    def record_cuda_graph_capture(self, seconds: float) -> None:
        """CUDA graph capture at start-up took ``seconds``."""

    def busy_timeline(self, source: str) -> TimelineLike:
        """The busy timeline whose figures the probe publishes."""


class TimelineLike(Protocol):
    """What the execute-step hook calls on ``exporters.probe.timeline.BusyTimeline``."""

    def begin(self) -> Any:
        """Mark the start of work (records a CUDA event, or reads perf_counter on the CPU)."""

    def end(self, token: Any) -> None:
        """Mark its end; never waits for the device."""


def _real_starter(role: str) -> ProbeLike | None:
    # Imported only here: a worker that has its device; every other process never loads the probe.
    from exporters.probe import start_probe

    return start_probe(role)


class _State:
    def __init__(self) -> None:
        self.probe: ProbeLike | None = None
        self.timeline: TimelineLike | None = None  # the worker's busy timeline, once its probe runs
        self.probe_tried = False
        self.starter: Callable[[str], ProbeLike | None] = _real_starter
        # Wall clock anchors a record in time; the monotonic clock measures its duration.
        self.wall: Callable[[], float] = time.time
        self.mono: Callable[[], float] = time.perf_counter
        self.local = threading.local()
        self._failures: set[str] = set()

    def start_probe(self) -> None:
        """Start this process's probe once; called when vLLM's worker (GPU or CPU) has its device."""
        if self.probe_tried:
            return
        self.probe_tried = True
        try:
            self.probe = self.starter(WORKER_ROLE)
        except Exception as exc:  # start_probe never raises, but a missing or broken probe must not stop vLLM
            LOG.warning(
                "loadlens vllm plugin: the probe did not start (%s: %s); nothing is recorded", type(exc).__name__, exc
            )
            return
        if self.probe is None:
            LOG.info("loadlens vllm plugin: probe disabled in this worker (LOADLENS_PROBE_DIR unset or no torch)")
        else:
            cuda = getattr(self.probe, "has_cuda", True)
            LOG.info("loadlens vllm plugin: probe started in worker process (%s)", "CUDA" if cuda else "no CUDA")
            try:
                self.timeline = self.probe.busy_timeline(BUSY_SOURCE)
            except Exception as exc:
                self.failed("busy_timeline", exc)

    def on_demand(self) -> bool:
        return getattr(self.local, "on_demand", 0) > 0

    def failed(self, hook: str, exc: BaseException) -> None:
        """One log line per hook for a failure inside our own code; the wrapped vLLM call goes on."""
        if hook in self._failures:
            return
        self._failures.add(hook)
        LOG.warning(
            "loadlens vllm plugin: hook %s failed while recording (%s: %s); vLLM continues, further failures of "
            "this hook are not logged",
            hook,
            type(exc).__name__,
            exc,
        )


STATE = _State()
