"""Reads the server's own gauges while a trial runs, so the sim (or a vLLM) gives its effective concurrency
without a Prometheus: ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and
``vllm:num_preemptions_total`` from ``GET /metrics``, summed over label sets, every ``interval`` seconds.

Usage::

    with ServerSampler("http://127.0.0.1:8000") as sampler:
        ...  # run the load
    sample = sampler.summary(windows=[(start_ts, end_ts)])
"""

from __future__ import annotations

import threading
import time
import urllib.request
from types import TracebackType

from loadlens.contracts.experiment_result import ServerSample

SERIES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_preemptions_total": "preemptions",
}


def parse_exposition(text: str) -> dict[str, float]:
    """The sum per series of :data:`SERIES` in a Prometheus text exposition (absent series are absent)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        name = line[: brace if 0 <= brace < space or (brace >= 0 and space < 0) else space]
        key = SERIES.get(name)
        if key is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        out[key] = out.get(key, 0.0) + value
    return out


class ServerSampler:
    def __init__(self, url: str, interval: float = 0.25) -> None:
        self.url = url.rstrip("/") + "/metrics"
        self.interval = interval
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="server-sampler", daemon=True)

    def __enter__(self) -> ServerSampler:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=2.0) as resp:
                    text = resp.read().decode(errors="replace")
                self.samples.append((time.time(), parse_exposition(text)))
            except (OSError, ValueError) as err:
                if len(self.errors) < 5:
                    self.errors.append(f"GET {self.url}: {err}")
            self._stop.wait(self.interval)

    def summary(self, windows: list[tuple[float, float]]) -> ServerSample:
        """Mean and peak running/waiting over the samples inside ``windows`` (the measured stages), and the
        preemptions counted between the first and the last of them."""
        inside = [s for ts, s in self.samples if any(lo <= ts <= hi for lo, hi in windows)]
        running = [s["running"] for s in inside if "running" in s]
        waiting = [s["waiting"] for s in inside if "waiting" in s]
        pre = [s["preemptions"] for s in inside if "preemptions" in s]
        return ServerSample(
            samples=len(inside),
            mean_running=sum(running) / len(running) if running else None,
            peak_running=max(running) if running else None,
            mean_waiting=sum(waiting) / len(waiting) if waiting else None,
            peak_waiting=max(waiting) if waiting else None,
            preemptions=pre[-1] - pre[0] if len(pre) >= 2 else None,
            errors=list(self.errors),
        )
