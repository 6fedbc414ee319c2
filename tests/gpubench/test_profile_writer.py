"""A sim GPU profile from measured efficiencies: the arithmetic by hand, and the written file loads in the sim."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporters.serving.engines.sim import SimEngine, load_gpu_profile, load_model_profile, roofline
from loadlens.contracts.gpu_bench_result import parse_gpu_bench
from loadlens.gpubench.profile_writer import ProfileWriteError, efficiencies, write_profile
from tests.gpubench.h200_figures import h200_result
from tests.sim.roofline_shapes import decode_shape, prefill_shape

# Llama-8B shape: q/o 4096², k/v 4096x1024, gate/up/down 4096x14336.
LAYER_LINEAR = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336


def expected() -> tuple[float, float]:
    gemm_flops = 2.0 * LAYER_LINEAR * 2048
    attn_flops = 4.0 * 32 * 128 * 2048 * 2049 / 2  # causal pairs of a 2,048-token prefill
    compute = (gemm_flops + attn_flops) / (gemm_flops / 0.70 + attn_flops / (667 / 989.5))  # cuDNN bf16 at 2,048
    weights = 2.0 * LAYER_LINEAR
    kv = 8 * 4096 * 2 * 8 * 128 * 2.0  # batch 8, context 4,096, 8 KV heads
    memory = (weights + kv) / (weights / 0.75 + kv / (4294 / 4800))  # cuDNN decode at 4,096
    return compute, memory


def test_efficiencies_by_hand() -> None:
    compute, memory, parts = efficiencies(h200_result())
    want_compute, want_memory = expected()
    assert LAYER_LINEAR == 218_103_808
    assert compute == pytest.approx(want_compute, rel=1e-12)
    assert memory == pytest.approx(want_memory, rel=1e-12)
    assert parts["attention_seq_len"] == 2048 and parts["decode_context"] == 4096
    assert parts["attention_share"] == pytest.approx(667 / 989.5, rel=1e-12)


def test_written_profile_loads_in_the_sim(tmp_path: Path) -> None:
    path = tmp_path / "measured.yaml"
    base = load_gpu_profile("h200")
    gpu = write_profile(h200_result(), base, path, "measured-h200")
    assert gpu == load_gpu_profile(str(path))
    want_compute, want_memory = expected()
    assert gpu.compute_efficiency == round(want_compute, 4)
    assert gpu.memory_efficiency == round(want_memory, 4)
    assert (gpu.name, gpu.marketing_name, gpu.memory_bytes) == ("measured-h200", "NVIDIA H200", 150754820096)
    assert gpu.source.startswith("measured by loadlens gpu-bench on NVIDIA H200 at 2026-12-04T12:00:00+00:00")
    unchanged = set(type(base).model_fields) - {"name", "marketing_name", "source", "memory_bytes",
                                                "compute_efficiency", "memory_efficiency"}  # fmt: skip
    assert {f: getattr(gpu, f) for f in unchanged} == {f: getattr(base, f) for f in unchanged}
    model = load_model_profile("deepseek-r1-distill-llama-8b")
    # The sim prices a prefill's compute and a decode's memory at the measured efficiencies.
    prefill = roofline.step_cost(model, gpu, prefill_shape(2048))
    assert prefill.compute_seconds == prefill.flops / (gpu.peak_tensor_flops * gpu.compute_efficiency)
    decode = roofline.step_cost(model, gpu, decode_shape(8, 4096))
    assert decode.memory_seconds == decode.bytes_moved / (gpu.hbm_bytes_per_s * gpu.memory_efficiency)
    SimEngine(model, gpu, registry=CollectorRegistry())  # the engine accepts it (KV sizing, knob checks)


def test_refusals() -> None:
    doc = h200_result().model_dump(mode="json")
    doc["device"].update(peak_tensor_flops=None, hbm_bytes_per_s=None, gpu_profile=None)
    with pytest.raises(ProfileWriteError, match="^the device's peaks are unknown: pass --gpu-profile NAME"):
        efficiencies(parse_gpu_bench(doc))
    doc = h200_result().model_dump(mode="json")
    doc["decode"], doc["roofline"] = [], []
    with pytest.raises(ProfileWriteError) as err:
        efficiencies(parse_gpu_bench(doc))
    assert str(err.value) == "no measured prefill GEMM, decode GEMM, decode attention figure to derive the profile from"
    doc = h200_result().model_dump(mode="json")
    doc["device"]["kind"] = "cpu"
    with pytest.raises(ProfileWriteError, match="from a GPU run only"):
        write_profile(parse_gpu_bench(doc), load_gpu_profile("h200"), Path("unused.yaml"), "x")
