"""The over-saturation test's error rates on a synthetic queueing server (loadgen/saturation.py).

Run: ``python -m benchmarks.saturation [--seeds 60] [--seconds 60]``.

The server: FCFS, ``slots`` sequences (8), each request holding one for 0.5–1.5 s (uniform; capacity 8
req/s) after a 50 ms prefill; Poisson arrivals at a multiple of capacity. The load generator's view, per
second: the mean TTFT of requests by the second their first token arrived, and the requests held (arrived,
not finished) in the middle of each second. Each stage is judged like the live check does (every 5 s, found
on the second consecutive hit) and once at its end. Reported per load: the share of stages found live, the
median time of that, and the share judged over-saturated at the end. Pure Python, a few seconds.
"""

from __future__ import annotations

import argparse
import heapq
import random
from statistics import median

from loadgen.saturation import CONFIRMATIONS, EVAL_INTERVAL_S, THRESHOLDS, Judgement, Series, judge

CAPACITY_MULTIPLES = (0.5, 0.75, 0.875, 0.95, 1.05, 1.25, 2.0)


def queue_sim(rate: float, duration: int, seed: int, slots: int = 8, service_s: float = 1.0) -> tuple[Series, Series]:
    """(TTFT by first-token second, requests held per second) of a FCFS server with ``slots`` sequences of
    ``service_s`` ± 50 % (capacity ``slots / service_s`` req/s) under Poisson arrivals at ``rate``."""
    rng = random.Random(seed)
    arrivals, t = [], rng.expovariate(rate)
    while t < duration:
        arrivals.append(t)
        t += rng.expovariate(rate)
    free = [0.0] * slots
    spans = []
    for a in arrivals:
        first = max(a, heapq.heappop(free)) + 0.05
        end = first + service_s * rng.uniform(0.5, 1.5)
        heapq.heappush(free, end)
        spans.append((a, first, end))
    bins: dict[int, list[float]] = {}
    for a, first, _ in spans:
        cell = bins.setdefault(int(first), [0.0, 0.0])
        cell[0] += first - a
        cell[1] += 1
    ttft = [(s + 0.5, v[0] / v[1]) for s, v in sorted(bins.items()) if s < duration]
    held = [(s + 0.5, float(sum(a <= s + 0.5 < e for a, _, e in spans))) for s in range(duration)]
    return ttft, held


def judge_at(mode: str, latency: Series, load: Series, now: float) -> Judgement:
    """The judgement at ``now`` seconds into the stage, on the window the load generator would use."""
    lo = THRESHOLDS.settle_fraction * now
    cut = [(x, y) for x, y in latency if lo <= x <= now], [(x, y) for x, y in load if lo <= x <= now]
    return judge(mode, *cut, window=(lo, now))


def first_detection(mode: str, latency: Series, load: Series, duration: float) -> float | None:
    """When the live check would report the stage: judged every 5 s, on the second consecutive hit."""
    streak = 0
    step = int(EVAL_INTERVAL_S)
    for now in range(step, int(duration) + 1, step):
        streak = streak + 1 if judge_at(mode, latency, load, now).over_saturated else 0
        if streak >= CONFIRMATIONS:
            return float(now)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=60)
    parser.add_argument("--seconds", type=int, default=60)
    args = parser.parse_args()
    print(f"FCFS, 8 sequences of 0.5-1.5 s (capacity 8 req/s), {args.seconds} s stages, {args.seeds} seeds")
    print(f"{'load':>8} {'found live':>10} {'median at':>9} {'at the end':>10}")
    for multiple in CAPACITY_MULTIPLES:
        found: list[float] = []
        at_end = 0
        for seed in range(args.seeds):
            ttft, held = queue_sim(8.0 * multiple, args.seconds, seed)
            when = first_detection("open", ttft, held, args.seconds)
            if when is not None:
                found.append(when)
            at_end += judge_at("open", ttft, held, args.seconds).over_saturated
        at = f"{median(found):.0f} s" if found else "-"
        share = len(found) / args.seeds
        print(f"{multiple:>7g}x {share:>10.0%} {at:>9} {at_end / args.seeds:>10.0%}")


if __name__ == "__main__":
    main()
