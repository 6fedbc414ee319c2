"""``loadlens gpu-bench``'s ``gpu_bench.json`` as a report page: the device, the notes, and the guide's chapter-3
tables (the same :func:`loadlens.contracts.gpu_bench_result.tables` the console prints). ``loadlens report
--results gpu_bench.json`` (or the directory holding it) writes it; no Prometheus is involved.

Usage::

    page = render_gpu_bench_page(load_gpu_bench(Path("results/gpu-bench/gpu_bench.json")), source="...")
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from loadlens.contracts.gpu_bench_result import (
    RESULT_FILE,
    GpuBenchError,
    GpuBenchResult,
    is_gpu_bench_document,
    parse_gpu_bench,
    tables,
)
from loadlens.report.documents import named_document, read_document
from loadlens.report.html import _CSS, _table, _utc


def gpu_bench_file(path: str | Path) -> Path | None:
    """The gpu_bench.json ``path`` names (the file, or a directory holding it), None when it names none."""
    return named_document(path, RESULT_FILE, is_gpu_bench_document)


def load_gpu_bench(file: Path) -> GpuBenchResult:
    """Parse ``file``; :class:`GpuBenchError` names the first bad key."""
    return parse_gpu_bench(read_document(file, GpuBenchError))


def render_gpu_bench_page(result: GpuBenchResult, *, source: str, generated: float | None = None) -> str:
    d = result.device
    title = f"loadlens report: gpu-bench on {d.name}"
    if d.kind == "cpu":
        title += " (CPU smoke test)"
    facts = [
        f"torch {d.torch_version}",
        f"CUDA {d.cuda_version}" if d.cuda_version else "",
        f"cuDNN {d.cudnn_version}" if d.cudnn_version else "",
        f"flash_attn {d.flash_attn_version}" if d.flash_attn_version else "",
        f"compute capability {d.compute_capability}" if d.compute_capability else "",
        f"{d.multiprocessors} SMs" if d.multiprocessors else "",
        f"{d.total_memory_bytes / 2**20:,.0f} MiB" if d.total_memory_bytes else "",
        f"peaks from GPU profile {d.gpu_profile}" if d.gpu_profile else "peaks unknown",
    ]
    m = result.model
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        '<p class="meta">',
        escape(" · ".join(f for f in facts if f)) + "<br>",
        escape(
            f"Model shape {m.name}: {m.layers} layers, hidden {m.hidden}, heads {m.heads} (KV {m.kv_heads}), head dim "
            f"{m.head_dim}, intermediate {m.intermediate if m.intermediate is not None else 'none (MoE)'}"
        )
        + "<br>",
        escape(
            f"Measured {result.created}; {result.settings.warmup} warm-ups, median of {result.settings.iterations} "
            f"timed calls; dtypes {', '.join(result.settings.dtypes)}; results {source}"
        ),
    ]
    if generated is not None:
        parts.append(f" · generated {escape(_utc(generated))}")
    parts.append("</p>")
    if result.notes:
        parts.append("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in result.notes) + "</ul>")
    for table in tables(result):
        parts.append(f'<h2 id="{escape(table.anchor)}">{escape(table.title)}</h2>')
        if table.note:
            parts.append(f'<p class="desc">{escape(table.note)}</p>')
        if table.rows:
            parts.extend(_table(table.columns, table.rows, "gpu-bench"))
        else:
            parts.append('<p class="nothing">Not measured in this run.</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
