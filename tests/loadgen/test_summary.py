"""The one end-of-run table: every column named with its statistic and unit, server columns only with them."""

from __future__ import annotations

from typing import Any

from loadgen.summary import LEGEND, stage_table

STAGE: dict[str, Any] = {
    "name": "c8", "target_users": 8, "completed": 380, "failed": 2, "request_throughput": 6.3333,
    "output_throughput": 810.67, "p50_ttft_ms": 95.04, "p99_ttft_ms": 412.3, "p50_itl_ms": 10.222,
    "p99_itl_ms": 31.5, "p99_e2el_ms": 2911.4, "goodput_ratio": 0.316,
}  # fmt: skip


def test_the_table_labels_every_column_and_formats_each_figure() -> None:
    doc = {
        "stages": [{**STAGE, "name": "warmup", "warmup": True, "completed": 20, "p99_e2el_ms": None}, STAGE,
                   {"name": "open", "target_rate": 2.5, "completed": 0, "failed": 0}],
        "overall": {**STAGE, "completed": 380},
        "validity": {"results_valid": True, "reasons": []},
    }  # fmt: skip
    assert stage_table(doc).splitlines() == [
        "stage                 load     ok failed   req/s out tok/s TTFT p50 ms TTFT p99 ms ITL p50 ms ITL p99 ms "
        "E2E p99 ms goodput % over-sat.",
        "--------------- ---------- ------ ------ ------- --------- ----------- ----------- ---------- ---------- "
        "---------- --------- ---------",
        "warmup (warmup)    8 users     20      2    6.33     810.7        95.0       412.3      10.22      31.50 "
        "         -      31.6         -",
        "c8                 8 users    380      2    6.33     810.7        95.0       412.3      10.22      31.50 "
        "      2911      31.6         -",
        "open             2.5 req/s      0      0       -         -           -           -          -          - "
        "         -         -         -",
        "overall                       380      2    6.33     810.7        95.0       412.3      10.22      31.50 "
        "      2911      31.6         -",
        *LEGEND.splitlines(),
    ]


def test_server_columns_appear_with_server_figures_and_invalid_results_are_said() -> None:
    server = {
        "peak_vram_gib": 36.7943,
        "mean_gpu_utilization_ratio": 0.684,
        "gpu_utilization_peak_to_trough_ratio": 0.43,
    }
    doc = {"stages": [{**STAGE, "server": server}], "validity": {"results_valid": False, "reasons": ["cpu 97 %"]}}
    lines = stage_table(doc).splitlines()
    assert lines[0].endswith(" goodput % over-sat. VRAM peak GiB GPU util mean % GPU util swing %")
    assert lines[2].endswith("      31.6         -         36.79              68               43")
    assert lines[-2].endswith(" (server columns: Prometheus, over the stage)")
    assert lines[-1] == "RESULTS INVALID: cpu 97 %"
