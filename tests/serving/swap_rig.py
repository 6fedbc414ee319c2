"""What the LoRA hot-swap tests behind the proxy share: large adapters on disk and a sim whose loads block."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry

from exporters.serving.engines.sim import SimEngine, load_gpu_profile, load_model_profile


def total(registry: CollectorRegistry, name: str) -> float:
    """Every sample named ``name`` summed over its labels."""
    return sum(s.value for m in registry.collect() for s in m.samples if s.name == name)


def write_adapter(root: Path, name: str) -> None:
    # Llama-8B shape, rank 256, all linear layers: 1.34 GB in bf16, read at 2 GB/s and speed 2: ~336 ms.
    (root / name).mkdir(parents=True)
    doc = {"r": 256, "lora_alpha": 512, "target_modules": "all-linear"}
    (root / name / "adapter_config.json").write_text(json.dumps(doc), encoding="utf-8")


def blocking_sim(registry: CollectorRegistry) -> SimEngine:
    """Llama-8B on an H100 at speed 2, served as ``tiny``, admitting rank-256 adapters."""
    return SimEngine(
        load_model_profile("deepseek-r1-distill-llama-8b"),
        load_gpu_profile("h100-sxm"),
        registry=registry,
        speed=2.0,
        served_model_name="tiny",
        knobs={"max_lora_rank": 256},
    )
