"""The busy timeline against a load of known period (issue 24 item 3): does the ``nn.Module`` hook's timeline
give back the period of a periodic on/off load?

The load: a module whose forward is ``repeats`` chained matmuls (bf16 on CUDA, fp32 on the CPU), ``repeats``
calibrated so one forward keeps the device busy ``duty × period``; the driver starts a forward every
``period`` seconds on an absolute schedule (a missed start is skipped, never shifted). On CUDA the *driver*
waits for the device after each forward (``torch.cuda.synchronize``), so the device idles for the rest of the
period; the hook itself never waits (counted: the script fails if a synchronize happens anywhere but in the
driver). The timeline (exporters.probe.timeline, CUDA events on a GPU, perf_counter on the CPU) is analysed
by loadlens.contracts.busy_math over the run: the recovered period must be within ``--tolerance`` (default
1 ms, the 1 ms bins' resolution) of each period, for 29 ms and 84 ms (guide 2.2).

::

    python -m benchmarks.gpu_busy_check --out results/gpu-check/busy                   # make gpu-check: CUDA
    python -m benchmarks.gpu_busy_check --out DIR --device cpu --duty 0.3 --seconds 2  # the CPU twin (CI)

Writes ``busy.json`` (docs/gpu-exporter.md, "Busy timeline check", lists its keys) and prints one line per
period. Exit 0 when every period is recovered, 1 when one is not, 2 (one line) without CUDA for
``--device cuda`` or without torch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from exporters.probe.timeline import BusyTimeline, hook_module
from loadlens.contracts.busy_math import busy_stats

PERIODS = (0.029, 0.084)
CALIBRATION_REPEATS = 16


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_busy_check", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results/gpu-check/busy"))
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--periods", type=lambda s: tuple(float(v) for v in s.split(",")), default=PERIODS,
                   help="seconds, comma-separated (default 0.029,0.084)")  # fmt: skip
    p.add_argument("--duty", type=float, default=0.5, help="busy share of each period (default 0.5)")
    p.add_argument("--seconds", type=float, default=3.0, help="load per period (default 3)")
    p.add_argument("--tolerance", type=float, default=0.001, help="allowed period error, seconds (default 1 ms)")
    p.add_argument("--size", type=int, default=0, help="matrix size (default 4096 on CUDA, 192 on the CPU)")
    args = p.parse_args(argv)
    if not 0 < args.duty < 1 or args.seconds <= 0 or args.tolerance <= 0 or not args.periods:
        p.error("--duty must be in (0, 1), --seconds and --tolerance positive, --periods not empty")
    return args


class _Counter:
    """Counts torch.cuda.synchronize calls; the driver's are expected, any other is the hook's."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.original(*args, **kwargs)


def build(torch: Any, device: str, size: int, repeats: int, busy: float = 0.0) -> Any:
    """The load and its input. On CUDA a forward is ``repeats`` matmuls (the host cannot see when they end
    without waiting); on the CPU, whose forward runs on this thread, it is matmuls until ``busy`` seconds
    have passed, so a loaded machine changes the number of matmuls and not the duty cycle."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(0)
    # Orthogonal: chained products keep their scale (no overflow to inf, no slow denormals on the CPU).
    weight = torch.linalg.qr(torch.randn(size, size, generator=gen))[0].to(device=device, dtype=dtype)
    x = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)

    class OnOff(torch.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(weight, requires_grad=False)
            self.repeats = repeats

        def forward(self, h: Any) -> Any:
            if busy > 0:
                end = time.perf_counter() + busy
                while time.perf_counter() < end:
                    h = h @ self.weight
                return h
            for _ in range(self.repeats):
                h = h @ self.weight
            return h

    return OnOff(), x


def _wait(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def calibrate(torch: Any, device: str, size: int, busy: float) -> int:
    """Matmuls per forward so that one forward takes about ``busy`` seconds (the median of 5 timings)."""
    model, x = build(torch, device, size, CALIBRATION_REPEATS)
    with torch.no_grad():
        model(x)
        _wait(torch, device)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            model(x)
            _wait(torch, device)
            times.append(time.perf_counter() - t0)
    per = sorted(times)[2] / CALIBRATION_REPEATS
    return max(1, round(busy / per))


def drive(torch: Any, device: str, model: Any, x: Any, period: float, seconds: float) -> int:
    """Forwards every ``period`` on an absolute schedule for ``seconds``; the number of forwards run."""
    start = time.perf_counter()
    runs = 0
    with torch.no_grad():
        k = 0
        while True:
            deadline = start + k * period
            if deadline >= start + seconds:
                return runs
            delay = deadline - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            model(x)
            _wait(torch, device)  # the load's own wait: the device idles until the next start
            runs += 1
            k = max(k + 1, int((time.perf_counter() - start) / period) + 1)  # a missed start is skipped


def measure(torch: Any, device: str, period: float, args: argparse.Namespace, size: int) -> dict[str, Any]:
    if device == "cuda":
        repeats, busy = calibrate(torch, device, size, args.duty * period), 0.0
    else:
        repeats, busy = 0, args.duty * period
    model, x = build(torch, device, size, repeats, busy)
    with torch.no_grad():  # warm-up outside the timeline
        model(x)
        _wait(torch, device)
    timeline = BusyTimeline(torch, source="module_forward")
    hook = hook_module(model, torch, timeline=timeline)
    counter = _Counter(torch.cuda.synchronize)
    torch.cuda.synchronize = counter
    try:
        runs = drive(torch, device, model, x, period, args.seconds)
    finally:
        torch.cuda.synchronize = counter.original
        hook.remove()
    _wait(torch, device)
    intervals = timeline.intervals()
    lo, hi = intervals[0][0], intervals[-1][1]
    s = busy_stats(intervals, lo, hi)
    error = None if s.period_seconds is None else s.period_seconds - period
    hook_syncs = counter.calls - (runs if device == "cuda" else 0)
    return {
        "period_s": period,
        "clock": timeline.clock,
        "matmuls_per_forward": repeats or None,  # null on the CPU: matmuls until the busy time has passed
        "forwards": runs,
        "intervals": len(intervals),
        "window_s": hi - lo,
        "busy_ratio": s.busy_ratio,
        "expected_duty": args.duty,
        "swing_ratio": s.swing_ratio,
        "recovered_period_s": s.period_seconds,
        "period_reason": s.period_reason,
        "period_error_s": error,
        "busy_run_p50_s": s.busy_run.p50 if s.busy_run else None,
        "idle_gap_p50_s": s.idle_gap.p50 if s.idle_gap else None,
        "hook_synchronize_calls": hook_syncs,
        "ok": error is not None and abs(error) <= args.tolerance and len(intervals) == runs and hook_syncs == 0,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        torch = importlib.import_module("torch")
    except Exception as err:
        print(f"gpu_busy_check: torch cannot be imported ({type(err).__name__}: {err})", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        build_cuda = getattr(torch.version, "cuda", None)
        print(
            f"gpu_busy_check: CUDA is not available (torch {torch.__version__}, CUDA build {build_cuda}); run it on "
            "a GPU host, or --device cpu for the CPU twin",
            file=sys.stderr,
        )
        return 2
    size = args.size or (4096 if args.device == "cuda" else 64)
    if args.device == "cpu":
        torch.set_num_threads(1)  # one core: the load's timing does not depend on the others' neighbours
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "size": size,
        "tolerance_s": args.tolerance,
        "periods": [measure(torch, args.device, period, args, size) for period in args.periods],
    }
    result["ok"] = all(p["ok"] for p in result["periods"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "busy.json").write_text(json.dumps(result, indent=2) + "\n")
    for p in result["periods"]:
        got = p["recovered_period_s"]
        print(
            f"{'PASS' if p['ok'] else 'FAIL'} period {p['period_s'] * 1e3:.1f} ms: recovered "
            f"{'none (' + str(p['period_reason']) + ')' if got is None else f'{got * 1e3:.1f} ms'}, busy "
            f"{p['busy_ratio']:.2f} (duty {p['expected_duty']:.2f}), {p['intervals']} intervals ({p['clock']})"
        )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
