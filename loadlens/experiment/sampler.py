"""Reads the server's own gauges while a trial runs, so the sim, a vLLM or an sglang server gives its
effective concurrency without a Prometheus: running and waiting requests, KV cache usage and preemptions
from ``GET /metrics`` every ``interval`` seconds, the KV capacity vLLM states (``vllm:cache_config_info``),
and the hot-swap series of loadlens's serving layer (``loadlens_lora_swap_blocking_seconds`` and its
counters: loadlens/experiment/swap_series.py).

The series are vLLM's (``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``, ``vllm:num_preemptions_total``; the sim's are the same) and each one's sglang
counterpart from loadlens/contracts/engine_series.py, the one mapping (``sglang:num_running_reqs``,
``sglang:num_queue_reqs``, ``sglang:token_usage``, ``sglang:num_retracted_requests_total``). Counts are
summed over label sets (engines, DP ranks, models), KV usage is the fullest label set's, as on the serving
dashboard.

Usage::

    with ServerSampler("http://127.0.0.1:8000") as sampler:
        ...  # run the load
    sample = sampler.summary(windows=[(start_ts, end_ts)])
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from types import TracebackType

from loadlens.contracts.engine_counters import counter_increases, parse_engine_counters
from loadlens.contracts.engine_series import BY_VLLM
from loadlens.contracts.experiment_result import ServerSample
from loadlens.contracts.kv_capacity import KvCapacity, parse_kv_capacity
from loadlens.experiment.swap_driver import SwapDriver
from loadlens.experiment.swap_series import SeriesKey, parse_swap_series, swap_figures

# sample key -> (vLLM series, how label sets combine)
SAMPLED: dict[str, tuple[str, Callable[[float, float], float]]] = {
    "running": ("vllm:num_requests_running", lambda a, b: a + b),
    "waiting": ("vllm:num_requests_waiting", lambda a, b: a + b),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", max),
    "preemptions": ("vllm:num_preemptions_total", lambda a, b: a + b),
}


def _series_names() -> dict[str, str]:
    out: dict[str, str] = {}
    for key, (vllm, _) in SAMPLED.items():
        entry = BY_VLLM[vllm]
        out[vllm] = key
        if entry.sglang is not None:
            # An exposition line carries no query: a counterpart that needs label matchers or added labels
            # could not be read by its name alone.
            assert not entry.sglang.matchers and not entry.sglang.labels, vllm
            out[entry.sglang.name] = key
    return out


SERIES = _series_names()
"""Exposed series name -> sample key, every dialect."""


def _split(line: str) -> tuple[str, str] | None:
    """A sample line's name and value text (labels skipped, quoted values with ``}`` or spaces too; an
    OpenMetrics timestamp after the value ignored)."""
    brace = line.find("{")
    space = line.find(" ")
    if brace < 0 or 0 <= space < brace:
        if space < 0:
            return None
        name, rest = line[:space], line[space:]
    else:
        name, i, quoted = line[:brace], brace + 1, False
        while i < len(line):
            c = line[i]
            if quoted and c == "\\":
                i += 1
            elif c == '"':
                quoted = not quoted
            elif c == "}" and not quoted:
                break
            i += 1
        rest = line[i + 1 :]
    fields = rest.split()
    return (name, fields[0]) if fields else None


def parse_exposition(text: str) -> dict[str, float]:
    """Each sample key's value in a Prometheus or OpenMetrics text exposition (absent series are absent)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        sample = _split(line)
        if sample is None:
            continue
        key = SERIES.get(sample[0])
        if key is None:
            continue
        try:
            value = float(sample[1])
        except ValueError:
            continue
        out[key] = SAMPLED[key][1](out[key], value) if key in out else value
    return out


class ServerSampler:
    def __init__(self, url: str, interval: float = 0.25) -> None:
        self.url = url.rstrip("/") + "/metrics"
        self.interval = interval
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.swap_samples: list[tuple[float, dict[SeriesKey, float]]] = []
        """The hot-swap series of each sample (loadlens/experiment/swap_series.py)."""
        self.counter_samples: list[tuple[float, dict[str, float]]] = []
        """vLLM's cumulative engine series of each sample (loadlens/contracts/engine_counters.py)."""
        self.capacity_samples: list[tuple[float, KvCapacity | None]] = []
        """The KV capacity each sample states (loadlens/contracts/kv_capacity.py)."""
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
                now = time.time()
                self.samples.append((now, parse_exposition(text)))
                self.swap_samples.append((now, parse_swap_series(text)))
                self.counter_samples.append((now, parse_engine_counters(text)))
                self.capacity_samples.append((now, parse_kv_capacity(text)))
            except (OSError, ValueError) as err:
                if len(self.errors) < 5:
                    self.errors.append(f"GET {self.url}: {err}")
            self._stop.wait(self.interval)

    def summary(
        self, windows: list[tuple[float, float]], delay_seconds: float | None = None, driver: SwapDriver | None = None
    ) -> ServerSample:
        """Mean and peak running/waiting/KV usage over the samples inside ``windows`` (the measured stages),
        the preemptions counted between the first and the last of them and, given the SLO file's
        ``lora_swap.delay_seconds``, the hot-swap figures (increases per measured stage, summed) with the swap
        driver's loads inside the windows."""
        swap = swap_figures(self.swap_samples, windows, delay_seconds) if delay_seconds is not None else None
        if swap is not None and driver is not None:
            swap.driver_loads, swap.driver_errors = driver.loads_inside(windows), list(driver.errors)
        inside = [s for ts, s in self.samples if any(lo <= ts <= hi for lo, hi in windows)]

        def values(key: str) -> list[float]:
            return [s[key] for s in inside if key in s]

        running, waiting, kv = values("running"), values("waiting"), values("kv_cache_usage")
        stated = [c for ts, c in self.capacity_samples if c is not None and any(lo <= ts <= hi for lo, hi in windows)]
        return ServerSample(
            samples=len(inside),
            mean_running=sum(running) / len(running) if running else None,
            peak_running=max(running) if running else None,
            mean_waiting=sum(waiting) / len(waiting) if waiting else None,
            peak_waiting=max(waiting) if waiting else None,
            mean_kv_cache_usage=sum(kv) / len(kv) if kv else None,
            peak_kv_cache_usage=max(kv) if kv else None,
            preemptions=_increase(inside),
            kv_cache_blocks=stated[-1].blocks if stated else None,
            kv_cache_block_size=stated[-1].block_size if stated else None,
            lora_swap=swap,
            engine_counters=counter_increases(self.counter_samples, windows),
            errors=list(self.errors),
        )


def _increase(inside: list[dict[str, float]]) -> float | None:
    """The preemption counter's increase over the samples. sglang creates a counter at its first use (vLLM
    at 0 at start-up): a sample that lacks it while a later one has it read 0. Never seen: None."""
    seen = [i for i, s in enumerate(inside) if "preemptions" in s]
    if not seen:
        return None
    first = inside[seen[0]]["preemptions"] if seen[0] == 0 else 0.0
    if seen[0] == 0 and len(seen) < 2:
        return None
    return inside[seen[-1]]["preemptions"] - first
