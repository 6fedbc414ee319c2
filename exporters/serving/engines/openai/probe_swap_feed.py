"""LoRA swap windows from the upstream's own workers (GPU, or vLLM's CPU worker), for the ``openai`` proxy.

The proxy times only the load/unload calls it forwards. A vLLM that runs the loadlens plugin also loads
adapters *on demand*, when a request names one that is not resident, with no call the proxy could see. The
plugin's probe records every such load (``events.lora_loads`` of its probe document, Unix times) and
publishes it within about 50 ms. This feed polls the probe directory the plugin writes to (the same shared
volume the GPU exporter reads), turns each new load into a swap window on the proxy's monotonic clock and
records it into the proxy's :class:`SwapWindows`, where the blocking attribution uses it like a forwarded call.

- A load the proxy also forwarded is recorded twice (its call and the worker's load, the second inside the
  first): the attribution takes the union of the windows inside one stall, so nothing counts twice.
- ``hostname`` keeps one upstream's documents apart from other servers' on a shared node directory (a
  Kubernetes pod's containers share the pod's hostname; a compose service gets ``hostname:``).
- A window is usable only once read: a request that ends within about one poll interval (plus the probe's
  publish delay) of a swap's end can miss it. Streams of a few hundred milliseconds or more do not.
- Unix -> monotonic conversion uses this host's clocks at read time; across hosts, clock skew shifts windows.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter

from exporters.serving.engines.openai.swap_windows import SwapWindows
from loadlens.util.probe_directory import ProbeReader

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_S = 0.2


class ProbeSwapFeed:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        windows: SwapWindows,
        *,
        registry: CollectorRegistry | None = None,
        hostname: str | None = None,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        reader: ProbeReader | None = None,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        if poll_interval_s <= 0:
            raise ValueError(f"poll interval must be > 0, got {poll_interval_s}")
        self.directory = Path(directory)
        self.windows = windows
        self.hostname = hostname or None
        self.poll_interval_s = poll_interval_s
        self._reader = reader if reader is not None else ProbeReader(self.directory)
        self._wall = wall
        self._mono = mono
        # (hostname, pid, start_time_ticks, adapter, start, end) of every load already recorded; pruned with the log.
        self._seen: dict[tuple[object, ...], float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed_once = False
        self.windows_total = Counter(
            "loadlens_proxy_probe_swap_windows",
            "LoRA loads read from the upstream's probe documents and recorded as swap windows (on-demand loads "
            "included), by whether a request waited for the load.",
            ["on_demand"],
            registry=registry,
        )
        self.polls_failed_total = Counter(
            "loadlens_proxy_probe_swap_feed_failures",
            "Polls of the upstream's probe directory that could not list it.",
            registry=registry,
        )
        for value in ("true", "false"):
            self.windows_total.labels(value)

    def poll_once(self) -> int:
        """Read the directory and record every load not seen before; returns how many were recorded."""
        result = self._reader.read()
        if not result.listed:
            self.polls_failed_total.inc()
            return 0
        offset = self._wall() - self._mono()  # Unix time -> this process's monotonic clock
        added = 0
        for doc in result.documents:
            if self.hostname is not None and doc.hostname != self.hostname:
                continue
            for load in doc.events.lora_loads:
                key = (doc.hostname, doc.pid, doc.start_time_ticks, load.adapter, load.start, load.end)
                if key in self._seen or load.end < load.start:
                    continue
                self._seen[key] = load.end
                self.windows.record(load.start - offset, load.end - offset, load.adapter, "load")
                self.windows_total.labels("true" if load.on_demand else "false").inc()
                added += 1
        if len(self._seen) > 4 * self.windows.max_windows:
            horizon = self._wall() - self.windows.max_age_s
            self._seen = {k: end for k, end in self._seen.items() if end >= horizon}
        return added

    def start(self) -> ProbeSwapFeed:
        self._thread = threading.Thread(target=self._run, name="loadlens-probe-swap-feed", daemon=True)
        self._thread.start()
        log.info(
            "LoRA swap windows from probe documents in %s (hostname %s), polled every %.2f s",
            self.directory,
            self.hostname or "any",
            self.poll_interval_s,
        )
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while True:
            try:
                self.poll_once()
            except Exception as err:  # one bad poll must never stop the feed or the server
                level = logging.DEBUG if self._failed_once else logging.WARNING
                self._failed_once = True
                log.log(level, "probe swap feed poll failed: %s: %s", type(err).__name__, err)
            if self._stop.wait(self.poll_interval_s):
                return
