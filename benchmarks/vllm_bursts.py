"""Whether the real vLLM CPU rig streams its tokens as it makes them, from a bare client (docs/calibration.md).

Run: ``python -m benchmarks.vllm_bursts [--requests N] [--shape tiny|calibration]`` (needs ``.venv-vllm``,
docs/real-vllm.md). It starts one vLLM serving the model of the shape (``tests/support/vllm_model.py``; default
the test suite's ``tiny``; ``tests/support/vllm_server.py``: its own process group, killed on exit) and sends N
streamed completions one at a time (64 tokens, ``ignore_eos``) from ``httpx``, three times: alone, with a ``/metrics``
poller every 0.25 s (what the experiment runner's sampler does), and alone again. Per request: the first
token's time, the median gap between tokens and the last token's time, as the client read them; a request
whose median gap is under 0.1 ms came in one burst. No load generator, no proxy: what it shows is the server's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.support.vllm_model import SERVED_NAME, SHAPES, rig_model
from tests.support.vllm_server import vllm_server

BURST_S = 1e-4


def one(url: str) -> tuple[float, float, float]:
    """(first token, median gap, last token) of one streamed completion, seconds from the request."""
    body = {"model": SERVED_NAME, "prompt": "hello world " * 60, "max_tokens": 64, "ignore_eos": True,
            "stream": True, "temperature": 0}  # fmt: skip
    t0 = time.monotonic()
    marks: list[float] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                marks.append(time.monotonic() - t0)
    gaps = sorted(b - a for a, b in zip(marks, marks[1:], strict=False))
    return marks[0], gaps[len(gaps) // 2], marks[-1]


def series(url: str, label: str, n: int) -> None:
    rows = [one(url) for _ in range(n)]
    bursts = sum(r[1] < BURST_S for r in rows)
    print(
        f"{label:<24} first token p50 {statistics.median(r[0] for r in rows) * 1000:7.1f} ms, median gap p50"
        f" {statistics.median(r[1] for r in rows) * 1000:7.3f} ms, last token p50"
        f" {statistics.median(r[2] for r in rows) * 1000:7.1f} ms, in one burst {bursts}/{n}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=30)
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="the served model's shape")
    args = p.parse_args(argv)
    with vllm_server(rig_model(args.shape), log_path=Path("results/vllm-bursts.log")) as server:
        for _ in range(3):
            one(server.url)  # warm-up
        series(server.url, "alone", args.requests)
        stop = threading.Event()

        def poll() -> None:
            with httpx.Client() as client:
                while not stop.is_set():
                    client.get(server.url + "/metrics")
                    stop.wait(0.25)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        series(server.url, "/metrics every 0.25 s", args.requests)
        stop.set()
        poller.join()
        series(server.url, "alone again", args.requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
