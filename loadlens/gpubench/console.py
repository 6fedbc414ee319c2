"""gpu-bench's tables (``loadlens.contracts.gpu_bench_result.tables``) as aligned text for the console."""

from __future__ import annotations

from loadlens.contracts.gpu_bench_result import GpuBenchResult, Table, tables


def render_table(table: Table) -> str:
    widths = [len(c) for c in table.columns]
    for row in table.rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: tuple[str, ...]) -> str:
        # Numbers right-aligned, words left-aligned; the last column (status, value) is not padded.
        out = [cell.rjust(w) if _numeric(cell) else cell.ljust(w) for cell, w in zip(cells, widths, strict=True)]
        return "  ".join(out).rstrip()

    lines = [table.title, line(table.columns), "  ".join("-" * w for w in widths)]
    lines += [line(row) for row in table.rows] if table.rows else ["(not measured)"]
    if table.note:
        lines.append(f"({table.note})")
    return "\n".join(lines)


def _numeric(cell: str) -> bool:
    return bool(cell) and (cell[0].isdigit() or cell == "–")


def render(result: GpuBenchResult) -> str:
    """Every table, with the device line and the notes first."""
    d = result.device
    head = f"loadlens gpu-bench: {d.name} ({d.kind}), torch {d.torch_version}"
    if d.cuda_version:
        head += f", CUDA {d.cuda_version}"
    head += f"; model shape {result.model.name}"
    parts = [head, *(f"note: {n}" for n in result.notes)]
    parts += [render_table(t) for t in tables(result)]
    return "\n\n".join(parts)
