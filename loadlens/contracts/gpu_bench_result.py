"""The typed ``gpu_bench.json`` that ``loadlens gpu-bench`` writes, and its tables: the console and the report
page (``loadlens report --results gpu_bench.json``) both render :func:`tables` (docs/gpu-bench.md lists every
key).

Every measured row keeps its raw time (``median_seconds``) beside the figures derived from it; a share of peak
is null when the device's peak is unknown (no packaged GPU profile matches it, or the run was the CPU smoke
test), never a guess. A row that could not run (backend not available for the shape or dtype) has
``status: unavailable`` and its reason, and no figures::

    result = parse_gpu_bench(json.loads(text))
    for table in tables(result): print(table.title, table.columns, table.rows)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

KIND = "loadlens-gpu-bench"
VERSION = 1
RESULT_FILE = "gpu_bench.json"
DASH = "–"
Status = Literal["ok", "unavailable", "error"]


class GpuBenchError(ValueError):
    """A file that is not a valid gpu_bench.json; the message is one line naming the first bad key."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DeviceInfo(_Model):
    kind: Literal["cuda", "cpu"]
    """``cpu`` is the developer smoke test (``--device cpu``): its figures say nothing about a GPU."""
    name: str
    """``torch.cuda.get_device_name`` (NVML's spelling), or the CPU's platform string."""
    total_memory_bytes: int | None
    compute_capability: str | None
    multiprocessors: int | None
    torch_version: str
    cuda_version: str | None
    """The CUDA runtime torch was built with (``torch.version.cuda``)."""
    cudnn_version: int | None
    flash_attn_version: str | None
    """The ``flash_attn`` package's version when installed, else null."""
    gpu_profile: str | None
    """The GPU profile the peaks come from (matched by device name, or ``--gpu-profile``); null: unknown."""
    peak_tensor_flops: float | None
    """Dense BF16/FP16 tensor FLOP/s from that profile (its datasheet figure)."""
    hbm_bytes_per_s: float | None


class ModelShape(_Model):
    name: str
    """What ``--model`` named: a packaged model profile, a profile YAML, a ``config.json`` or a model directory."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int | None
    """Null for a mixture-of-experts config (no dense MLP): its GEMM points use the attention projections only."""


class Settings(_Model):
    warmup: int
    iterations: int
    quick: bool
    causal: bool
    dtypes: list[str]


class AttentionRow(_Model):
    backend: str
    dtype: str
    seq_len: int
    batch: int
    heads: int
    head_dim: int
    causal: bool
    flops: float
    status: Status
    reason: str | None = None
    median_seconds: float | None = None
    tflops: float | None = None
    share_of_peak: float | None = None


class DecodeRow(_Model):
    backend: str
    dtype: str
    context: int
    batch: int
    heads: int
    head_dim: int
    kv_bytes: int
    """K and V read by one decode step: 2 · batch · heads · context · head_dim · element bytes."""
    status: Status
    reason: str | None = None
    median_seconds: float | None = None
    gb_per_s: float | None = None
    """``kv_bytes`` / median time, in 10^9 bytes per second."""
    share_of_hbm: float | None = None


class RooflineRow(_Model):
    op: Literal["gemm", "copy"]
    phase: Literal["prefill", "decode"]
    label: str
    """What the shape is: a linear module of the model (``gate_proj``), or the tensor a copy moves."""
    dtype: str
    m: int | None
    n: int | None
    k: int | None
    flops: float
    bytes: float
    """Bytes a perfect kernel moves: operands read once and the output written once."""
    status: Status
    reason: str | None = None
    median_seconds: float | None = None
    tflops: float | None = None
    gb_per_s: float | None = None
    intensity: float
    """FLOPs per byte (0 for a copy)."""
    bound: Literal["compute", "memory"] | None = None
    """Which roof limits the shape at the device's peaks (null: peaks unknown)."""
    share_of_roof: float | None = None
    """Achieved over the roof: FLOP/s over min(peak, intensity · HBM) for a GEMM, bytes/s over HBM for a copy."""


class GraphRow(_Model):
    layers: int
    width: int
    heads: int
    batch: int
    dtype: str
    first_call_seconds: float
    """The first forward of the freshly built stack (kernel selection, lazy initialisation, allocation)."""
    eager_step_seconds: float
    """Median steady-state eager step."""
    capture_ok: bool
    capture_seconds: float | None = None
    replay_step_seconds: float | None = None
    speedup: float | None = None
    """Eager step over replay step."""
    reason: str | None = None
    """Why there is no graph figure: capture failed (its error) or the device has no CUDA graphs."""


class GpuBenchResult(_Model):
    kind: Literal["loadlens-gpu-bench"]
    version: Literal[1]
    created: str
    """UTC ISO 8601."""
    device: DeviceInfo
    model: ModelShape
    settings: Settings
    attention: list[AttentionRow]
    decode: list[DecodeRow]
    roofline: list[RooflineRow]
    graph: GraphRow | None
    notes: list[str]
    """What the reader must know: the CPU smoke-test label, why shares are null, unavailable backends."""


def parse_gpu_bench(doc: Any) -> GpuBenchResult:
    """Validate a decoded gpu_bench.json; :class:`GpuBenchError` names the first bad key."""
    try:
        return GpuBenchResult.model_validate(doc)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise GpuBenchError(f"gpu_bench.json: {where}: {first['msg']}") from None


def is_gpu_bench_document(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("kind") == KIND


# --- tables -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    anchor: str
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""


def _num(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    return DASH if value is None else f"{100 * value:.1f} %"


def _us(seconds: float | None) -> str:
    return DASH if seconds is None else f"{seconds * 1e6:,.1f}"


def _status(row: AttentionRow | DecodeRow | RooflineRow) -> str:
    return "ok" if row.status == "ok" else f"{row.status}: {row.reason or ''}".strip()


def tables(result: GpuBenchResult) -> list[Table]:
    """The guide's tables (3.1 attention, 3.2 decode KV bandwidth, 3.3 CUDA graph step) and the roofline points,
    as text cells."""
    out: list[Table] = []
    peak = result.device.peak_tensor_flops
    peak_note = (
        f"share of the {peak / 1e12:,.1f} TFLOP/s dense peak ({result.device.gpu_profile})"
        if peak is not None
        else "share of peak: unknown (no GPU profile for this device)"
    )
    convention = "causal, 4·b·h·s²·d / 2" if result.settings.causal else "non-causal, 4·b·h·s²·d"
    out.append(
        Table(
            "attention",
            "3.1 Attention throughput (prefill)",
            ("Backend", "dtype", "Seq len", "Batch", "µs", "TFLOP/s", "Share of peak", "Status"),
            tuple(
                (
                    r.backend,
                    r.dtype,
                    f"{r.seq_len:,}",
                    str(r.batch),
                    _us(r.median_seconds),
                    _num(r.tflops),
                    _pct(r.share_of_peak),
                    _status(r),
                )  # fmt: skip
                for r in result.attention
            ),
            f"heads {result.model.heads}, head dim {result.model.head_dim}; FLOPs {convention}; {peak_note}",
        )
    )
    hbm = result.device.hbm_bytes_per_s
    out.append(
        Table(
            "decode",
            "3.2 Decode KV-cache read bandwidth",
            ("Backend", "dtype", "Context", "Batch", "µs", "GB/s", "Share of HBM", "Status"),
            tuple(
                (
                    r.backend,
                    r.dtype,
                    f"{r.context:,}",
                    str(r.batch),
                    _us(r.median_seconds),
                    _num(r.gb_per_s),
                    _pct(r.share_of_hbm),
                    _status(r),
                )  # fmt: skip
                for r in result.decode
            ),
            "one query token per sequence; GB/s of K+V read (10^9 B/s); "
            + (f"share of {hbm / 1e9:,.0f} GB/s HBM" if hbm is not None else "share of HBM: unknown"),
        )
    )
    out.append(
        Table(
            "roofline",
            "Roofline points (GEMM and copy)",
            ("Op", "Phase", "Shape", "dtype", "FLOP/B", "µs", "TFLOP/s", "GB/s", "Bound", "Share of roof"),
            tuple(
                (
                    r.op,
                    r.phase,
                    _shape(r),
                    r.dtype,
                    _num(r.intensity),
                    _us(r.median_seconds),
                    _num(r.tflops),
                    _num(r.gb_per_s),
                    r.bound or DASH,
                    _pct(r.share_of_roof) if r.status == "ok" else _status(r),
                )  # fmt: skip
                for r in result.roofline
            ),
            "GEMM m×k by k×n (m = tokens); bytes = operands read once + output written once",
        )
    )
    g = result.graph
    graph_rows: tuple[tuple[str, ...], ...] = ()
    note = ""
    if g is not None:
        graph_rows = (
            ("capture success", "yes" if g.capture_ok else "no"),
            ("capture (ms)", DASH if g.capture_seconds is None else f"{g.capture_seconds * 1e3:,.1f}"),
            ("first call (ms)", f"{g.first_call_seconds * 1e3:,.1f}"),
            ("eager step (µs)", _us(g.eager_step_seconds)),
            ("graph replay step (µs)", _us(g.replay_step_seconds)),
            ("speedup", DASH if g.speedup is None else f"{g.speedup:.2f}×"),
        )
        note = f"{g.layers}-layer {g.width}-wide transformer stack, batch {g.batch}, one token, {g.dtype}" + (
            f"; {g.reason}" if g.reason else ""
        )
    out.append(Table("graph", "3.3 CUDA graph capture and first-call latency", ("Figure", "Value"), graph_rows, note))
    return out


def _shape(r: RooflineRow) -> str:
    if r.op == "gemm":
        return f"{r.label} {r.m}×{r.k}·{r.k}×{r.n}"
    mib = r.bytes / 2 / 2**20  # a copy moves its tensor twice (read + write)
    return f"{r.label} {mib:,.0f} MiB" if mib >= 10 else f"{r.label} {mib:.2f} MiB"
