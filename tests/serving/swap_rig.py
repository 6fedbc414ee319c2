"""What the LoRA hot-swap tests behind the proxy share: large adapters on disk and a sim whose loads block."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from exporters.serving.engines.sim import SimEngine, load_gpu_profile, load_model_profile

ADAPTER_READ_BYTES_PER_S = 0.5e9
"""A slow network volume instead of the H100 profile's 2 GB/s NVMe: each rank-256 load blocks the sim ~1.34 s,
seconds beyond the 200 ms delay SLO and any hop or slack, so which requests a load delayed cannot flip."""


def total(registry: CollectorRegistry, name: str) -> float:
    """Every sample named ``name`` summed over its labels."""
    return sum(s.value for m in registry.collect() for s in m.samples if s.name == name)


def write_adapter(root: Path, name: str) -> None:
    # Llama-8B shape, rank 256, all linear layers: 1.34 GB in bf16, read at 0.5 GB/s and speed 2: ~1.34 s.
    (root / name).mkdir(parents=True)
    doc = {"r": 256, "lora_alpha": 512, "target_modules": "all-linear"}
    (root / name / "adapter_config.json").write_text(json.dumps(doc), encoding="utf-8")


def blocking_sim(registry: CollectorRegistry) -> SimEngine:
    """Llama-8B on an H100 reading adapters from slow storage (:data:`ADAPTER_READ_BYTES_PER_S`) at speed 2,
    served as ``tiny``, admitting rank-256 adapters. A decode step of a few streams takes ~5 ms."""
    gpu = load_gpu_profile("h100-sxm").model_copy(update={"adapter_read_bytes_per_s": ADAPTER_READ_BYTES_PER_S})
    return SimEngine(
        load_model_profile("deepseek-r1-distill-llama-8b"),
        gpu,
        registry=registry,
        speed=2.0,
        served_model_name="tiny",
        knobs={"max_lora_rank": 256},
    )


class Stream(threading.Thread):
    """One streamed base-model completion of exactly ``max_tokens`` tokens; records when each token's chunk
    arrived (``time.monotonic()``, the clock the sim and the proxy stamp with)."""

    def __init__(self, url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.max_tokens = max_tokens
        self.times: list[float] = []
        self.error: BaseException | None = None
        self._progress = threading.Condition()
        self._ended = False

    def run(self) -> None:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": self.max_tokens, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=60) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line.startswith("data: {"):  # one chunk per token, as the sim sends and the proxy forwards
                        with self._progress:
                            self.times.append(time.monotonic())
                            self._progress.notify_all()
        except BaseException as err:  # reported by the test
            self.error = err
        finally:
            with self._progress:
                self._ended = True
                self._progress.notify_all()

    def wait_for(self, tokens: int, timeout: float = 30.0) -> bool:
        """Whether ``tokens`` chunks arrived (False when the stream ended or broke first, or on timeout)."""
        with self._progress:
            self._progress.wait_for(lambda: len(self.times) >= tokens or self._ended, timeout)
            return len(self.times) >= tokens


def advance(streams: Sequence[Stream], tokens: int) -> None:
    """Wait until every stream got ``tokens`` more chunks: the streams are decoding, whatever the machine's
    pace (a fixed sleep only hopes so), and each has shown progress since whatever happened before."""
    targets = [len(s.times) + tokens for s in streams]
    for s, target in zip(streams, targets, strict=True):
        assert s.wait_for(target), f"a stream stopped at {len(s.times)} tokens: {s.error!r}"
