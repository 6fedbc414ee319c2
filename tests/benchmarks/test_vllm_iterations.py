"""benchmarks/vllm_iterations.py: vLLM's decode-only steps read from its iteration log, by batch."""

from __future__ import annotations

from benchmarks.vllm_iterations import decode_steps, summary

# vLLM 0.32's line (CPU build, --enable-logging-iteration-details), as the rig's log holds it.
LINE = (
    "(APIServer pid=5556) INFO 12-06 01:00:18 [loggers.py:199] Engine 000: Iteration({i}): {c} context requests, "
    "{ct} context tokens, {g} generation requests, {g} generation tokens, iteration elapsed time: {ms} ms, CPU KV "
    "cache usage: 0.1%"
)


def test_only_decode_steps_count_grouped_by_their_batch() -> None:
    lines = [
        LINE.format(i=0, c=1, ct=245, g=0, ms="138.03"),  # a prefill alone
        LINE.format(i=1, c=1, ct=238, g=1, ms="122.08"),  # a prefill beside a decode: a stall, not a decode step
        LINE.format(i=2, c=0, ct=0, g=1, ms="10.50"),
        LINE.format(i=3, c=0, ct=0, g=1, ms="10.70"),
        LINE.format(i=4, c=0, ct=0, g=2, ms="11.25"),
        LINE.format(i=5, c=0, ct=0, g=0, ms="0.10"),  # nothing to do: not a step of any batch
        "(APIServer pid=5556) INFO 12-06 01:00:18 [loggers.py:123] Avg prompt throughput: 10.0 tokens/s",
    ]
    steps = decode_steps(lines)
    assert steps == {1: [10.5, 10.7], 2: [11.25]}
    assert summary(steps, least=1) == [(1, 2, 10.6), (2, 1, 11.25)]
    assert summary(steps, least=2) == [(1, 2, 10.6)]
