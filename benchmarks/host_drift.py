"""How steady this host is over minutes: the noise floor of a calibration run on it.

Two fixed pieces of work are timed in turn, over and over, for ``--seconds``, in windows of ``--window-s``:
**compute**, a single-threaded float32 product of two ``--size`` square matrices (they sit in the CPU's cache),
and **memory**, a vector times a ``--memory-mib`` float32 matrix (read from DRAM each time, as a decode step
reads a model's weights). Each window's median call time of each is one point. On a quiet host that kept its
speed the points agree; on a VM whose neighbours share its memory bus or move its clock, they wander, and so
do a served model's step times between the stages of a sweep. Each summary's ``spread`` (the 95th over the
5th percentile of the windows' medians, minus 1) bounds how closely two stages measured minutes apart can
agree about the same engine step, whatever the sim does (docs/calibration.md, *Limits*).

The work runs in a child process with one BLAS thread (set before numpy loads), pinned to ``--cpu`` when given
(the rig pins vLLM's worker to core 0). The host's steal time, as its kernel counts it, is printed beside.

    python -m benchmarks.host_drift [--seconds 120] [--window-s 2] [--size 384] [--memory-mib 256] [--cpu N]
                                    [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from exporters.gpu.stats import percentile

THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


WORK = ("compute", "memory")


@dataclass(frozen=True, slots=True)
class Window:
    start_s: float
    """Seconds since the first window began."""
    compute_ms: float
    """The median time of one cached matrix product in this window."""
    memory_ms: float
    """The median time of one vector-matrix product read from memory in this window."""
    calls: int
    """Calls of each work in the window."""


def _cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from /proc/stat; None where the kernel does not say."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    if len(fields) < 9:
        return None
    return int(fields[8]), sum(int(x) for x in fields[1:])


def measure(
    size: int,
    memory_mib: int,
    seconds: float,
    window_s: float,
    cpu: int | None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[Window]:
    """The windows, measured in this process (the caller sees to the BLAS threads); ``clock`` is a test seam."""
    import numpy as np  # here: the child sets its BLAS threads before numpy first loads

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    rows = memory_mib * 2**20 // (4 * 2048)
    weights = rng.standard_normal((rows, 2048), dtype=np.float32)
    vector = rng.standard_normal(rows, dtype=np.float32)
    for _ in range(3):
        a @ b  # warm: the first calls page the matrices in
        vector @ weights
    windows: list[Window] = []
    start = t0 = clock()
    end = t0 + seconds
    while start < end:
        compute: list[float] = []
        memory: list[float] = []
        while clock() - start < window_s or not compute:
            now = clock()
            a @ b
            mid = clock()
            vector @ weights
            compute.append(mid - now)
            memory.append(clock() - mid)
        windows.append(Window(start - t0, statistics.median(compute) * 1000, statistics.median(memory) * 1000,
                              len(compute)))  # fmt: skip
        start = clock()
    return windows


def measure_alone(size: int, memory_mib: int, seconds: float, window_s: float, cpu: int | None) -> list[Window]:
    """:func:`measure` in a fresh child process with one BLAS thread."""
    saved = {name: os.environ.get(name) for name in THREAD_VARIABLES}
    os.environ.update({name: "1" for name in THREAD_VARIABLES})
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(measure, size, memory_mib, seconds, window_s, cpu).result()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def summarise(values: list[float]) -> dict[str, float]:
    """One work's window medians (ms): their median, 5th and 95th percentiles (linear interpolation), min and
    max, ``spread`` = p95 / p5 − 1 and ``max_over_min`` = max / min − 1."""
    if not values:
        raise ValueError("no windows measured")
    data = sorted(values)
    p5, p95 = percentile(data, 0.05), percentile(data, 0.95)
    return {
        "median_ms": statistics.median(values),
        "p5_ms": p5,
        "p95_ms": p95,
        "min_ms": min(values),
        "max_ms": max(values),
        "spread": p95 / p5 - 1,
        "max_over_min": max(values) / min(values) - 1,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_drift", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to measure (default 120)")
    parser.add_argument("--window-s", type=float, default=2.0, help="one point per this many seconds (default 2)")
    parser.add_argument("--size", type=int, default=384, help="the square matrices' side (default 384)")
    parser.add_argument("--memory-mib", type=int, default=256,
                        help="the matrix read from memory, MiB (default 256: past any CPU cache)")  # fmt: skip
    parser.add_argument("--cpu", type=int, default=None, help="pin the work to this CPU (default: not pinned)")
    parser.add_argument("--json", type=Path, default=None, help="write the windows and the summary here")
    args = parser.parse_args(argv)
    if min(args.seconds, args.window_s, args.size, args.memory_mib) <= 0 or args.window_s > args.seconds:
        parser.error("--seconds, --window-s, --size and --memory-mib must be positive, --window-s at most --seconds")
    if args.cpu is not None and args.cpu not in os.sched_getaffinity(0):
        parser.error(f"--cpu {args.cpu}: not a CPU this process may run on ({sorted(os.sched_getaffinity(0))})")
    before = _cpu_ticks()
    windows = measure_alone(args.size, args.memory_mib, args.seconds, args.window_s, args.cpu)
    after = _cpu_ticks()
    summaries = {
        "compute": summarise([w.compute_ms for w in windows]),
        "memory": summarise([w.memory_ms for w in windows]),
    }
    steal = None
    if before is not None and after is not None and after[1] > before[1]:
        steal = (after[0] - before[0]) / (after[1] - before[1])
    print(f"host drift: one thread{'' if args.cpu is None else f' on CPU {args.cpu}'}, {len(windows)} windows of "
          f"{args.window_s:g} s; steal {'not reported' if steal is None else f'{steal:.1%} of CPU time'}")  # fmt: skip
    labels = {"compute": f"compute ({args.size}x{args.size} product)",
              "memory": f"memory ({args.memory_mib} MiB read)"}  # fmt: skip
    for work in WORK:
        s = summaries[work]
        print(f"  {labels[work]}: median {s['median_ms']:.3f} ms, p5 {s['p5_ms']:.3f}, p95 {s['p95_ms']:.3f}, "
              f"min {s['min_ms']:.3f}, max {s['max_ms']:.3f}; spread (p95/p5 - 1) {s['spread']:.1%}, "
              f"max/min - 1 {s['max_over_min']:.1%}")  # fmt: skip
    if args.json is not None:
        doc = {"size": args.size, "memory_mib": args.memory_mib, "window_s": args.window_s, "cpu": args.cpu,
               "steal_ratio": steal, "summary": summaries, "windows": [asdict(w) for w in windows]}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
