"""In-process probe cost per snapshot against segment count, on synthetic ``memory_snapshot()`` lists.

    python -m benchmarks.probe            # ~20 s
    python -m benchmarks.probe --quick

What is measured (median of repeats, this process's wall time on one thread):
- ``summarise``: the probe's reduction of one snapshot (free blocks and pools per device); what the probe adds
  on top of torch's own ``memory_snapshot()``, which a real GPU run has to measure (not here: no GPU).
- ``tick``: one full probe pass with a snapshot due: memory_stats, the reduction, the document model, JSON and
  the atomic write (fake torch, so torch's own cost is excluded).
- the back-off the measured cost would cause: ``max(30 s, cost / 1 %)``.
Segments hold 8 blocks of 2 MiB each, every fourth one free.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from exporters.probe.probe import Probe
from exporters.probe.reading import summarise_snapshot
from tests.probe.fakes import MIB, FakeCuda, fake_torch, stats, synthetic_snapshot

SEGMENTS = (100, 1000, 5000, 20000)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.probe")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv or [])
    repeats = 3 if args.quick else 9
    print(f"{'segments':>9} {'blocks':>7} {'summarise':>11} {'tick':>9} {'snapshot every':>15}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in SEGMENTS[:3] if args.quick else SEGMENTS:
            snapshot = synthetic_snapshot(n)
            cuda = FakeCuda({0: stats(n * 16 * MIB, n * 12 * MIB, n * 7 * MIB)}, snapshot)
            probe = Probe("bench", tmp, fake_torch(cuda), env={}, snapshot_interval=30.0)

            def summarise_once(s: list[dict[str, object]] = snapshot) -> None:
                summarise_snapshot(s, [0], 0.0)

            summarise = median_seconds(summarise_once, repeats)

            def tick(p: Probe = probe) -> None:
                p._next_snapshot = -float("inf")  # force a snapshot on every pass
                p.write_now()

            cost = median_seconds(tick, repeats)
            every = max(30.0, cost / 0.01)
            print(f"{n:>9} {n * 8:>7} {summarise * 1e3:>9.2f}ms {cost * 1e3:>7.2f}ms {every:>14.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
