"""What the reliability drills (benchmarks/drills.py) read of the servers they drill, and how long they wait."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[str, float]:
    """Every sample of ``url``/metrics summed over its labels, by sample name."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def settled(urls: Sequence[str], names: Sequence[str], timeout_s: float = 10.0) -> dict[str, dict[str, float]]:
    deadline = time.monotonic() + timeout_s
    while True:
        figures = {u: {k: v for k, v in scrape(u).items() if k in names} for u in urls}
        if all(v == 0 for f in figures.values() for v in f.values()) or time.monotonic() > deadline:
            return figures
        time.sleep(0.2)


def count_reaches(url: str, name: str, target: float, timeout_s: float = 10.0) -> float:
    """The counter's value once it reaches ``target``, or at the deadline (a loaded machine is slow, not wrong)."""
    deadline = time.monotonic() + timeout_s
    while (value := scrape(url).get(name, 0.0)) < target and time.monotonic() < deadline:
        time.sleep(0.2)
    return value


def wait_for(predicate: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until ``predicate()`` held, or None after ``timeout_s``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.25)
    return None
