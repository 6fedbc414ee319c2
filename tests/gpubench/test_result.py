"""The gpu_bench.json model (every key, parse errors) and its tables on the console."""

from __future__ import annotations

import json

import pytest

from loadlens.contracts.gpu_bench_result import GpuBenchError, parse_gpu_bench, tables
from loadlens.gpubench.console import render, render_table
from tests.gpubench.h200_figures import h200_result


def test_json_round_trip_and_keys() -> None:
    result = h200_result()
    doc = json.loads(json.dumps(result.model_dump(mode="json")))
    assert parse_gpu_bench(doc) == result
    assert set(doc) == {"kind", "version", "created", "device", "model", "settings", "attention", "decode",
                        "roofline", "graph", "notes"}  # fmt: skip
    assert set(doc["attention"][0]) == {"backend", "dtype", "seq_len", "batch", "heads", "head_dim", "causal", "flops",
                                        "status", "reason", "median_seconds", "tflops", "share_of_peak"}  # fmt: skip
    assert set(doc["decode"][0]) == {"backend", "dtype", "context", "batch", "heads", "head_dim", "kv_bytes",
                                     "status", "reason", "median_seconds", "gb_per_s", "share_of_hbm"}  # fmt: skip
    assert set(doc["roofline"][0]) == {"op", "phase", "label", "dtype", "m", "n", "k", "flops", "bytes", "status",
                                       "reason", "median_seconds", "tflops", "gb_per_s", "intensity", "bound",
                                       "share_of_roof"}  # fmt: skip
    assert set(doc["graph"]) == {"layers", "width", "heads", "batch", "dtype", "first_call_seconds",
                                 "eager_step_seconds", "capture_ok", "capture_seconds", "replay_step_seconds",
                                 "speedup", "reason"}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("device"), "gpu_bench.json: device: Field required"),
        (lambda d: d.update(kind="other"), "gpu_bench.json: kind: Input should be 'loadlens-gpu-bench'"),
        (
            lambda d: d["attention"][0].update(tflops="fast"),
            "gpu_bench.json: attention.0.tflops: Input should be a valid number, unable to parse string as a number",
        ),
        (lambda d: d["decode"][1].update(extra=1), "gpu_bench.json: decode.1.extra: Extra inputs are not permitted"),
    ],
)
def test_parse_errors_name_the_key(change: object, message: str) -> None:
    doc = h200_result().model_dump(mode="json")
    change(doc)  # type: ignore[operator]
    with pytest.raises(GpuBenchError) as err:
        parse_gpu_bench(doc)
    assert str(err.value) == message


def test_tables_cells() -> None:
    by_anchor = {t.anchor: t for t in tables(h200_result())}
    assert list(by_anchor) == ["attention", "decode", "roofline", "graph"]
    attention = by_anchor["attention"]
    assert attention.columns == ("Backend", "dtype", "Seq len", "Batch", "µs", "TFLOP/s", "Share of peak", "Status")
    assert attention.rows[1] == ("cudnn", "bf16", "2,048", "16", "1,648.4", "667.0", "67.4 %", "ok")
    assert attention.rows[11] == ("math", "bf16", "8,192", "4", "–", "–", "–", "unavailable: skipped")
    assert attention.note == ("heads 32, head dim 128; FLOPs non-causal, 4·b·h·s²·d; share of the 989.5 TFLOP/s "
                              "dense peak (h200)")  # fmt: skip
    assert by_anchor["decode"].rows[2] == ("cudnn", "bf16", "8,192", "8", "242.1", "4,435.0", "92.4 %", "ok")
    assert by_anchor["roofline"].rows[4] == (
        "gemm", "decode", "gate_proj 8×4096·4096×14336", "bf16", "8.0", "32.7", "28.7", "3,600.0", "memory",
        "75.0 %")  # fmt: skip
    assert by_anchor["graph"].rows == (
        ("capture success", "yes"), ("capture (ms)", "12.0"), ("first call (ms)", "138.0"),
        ("eager step (µs)", "1,282.0"), ("graph replay step (µs)", "399.0"), ("speedup", "3.21×"))  # fmt: skip


def test_tables_without_peaks_say_so() -> None:
    doc = h200_result().model_dump(mode="json")
    doc["device"].update(gpu_profile=None, peak_tensor_flops=None, hbm_bytes_per_s=None)
    for row in doc["attention"]:
        row["share_of_peak"] = None
    by_anchor = {t.anchor: t for t in tables(parse_gpu_bench(doc))}
    assert by_anchor["attention"].note.endswith("share of peak: unknown (no GPU profile for this device)")
    assert by_anchor["attention"].rows[0][6] == "–"
    assert by_anchor["decode"].note.endswith("share of HBM: unknown")


def test_console_text() -> None:
    text = render(h200_result())
    lines = text.splitlines()
    assert lines[0] == ("loadlens gpu-bench: NVIDIA H200 (cuda), torch 2.11.0+cu130, CUDA 13.0; model shape "
                        "deepseek-r1-distill-llama-8b")  # fmt: skip
    graph = render_table(tables(h200_result())[-1]).splitlines()
    assert graph == [
        "3.3 CUDA graph capture and first-call latency",
        "Figure                  Value",
        "----------------------  -------",
        "capture success         yes",
        "capture (ms)               12.0",
        "first call (ms)           138.0",
        "eager step (µs)         1,282.0",
        "graph replay step (µs)    399.0",
        "speedup                   3.21×",
        "(8-layer 1024-wide transformer stack, batch 32, one token, bf16)",
    ]
    doc = h200_result().model_dump(mode="json")
    doc["graph"] = None
    assert "3.3 CUDA graph capture and first-call latency\nFigure  Value\n------  -----\n(not measured)" in render(
        parse_gpu_bench(doc))  # fmt: skip
