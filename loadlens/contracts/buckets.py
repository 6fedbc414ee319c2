"""Every histogram bucket set in loadlens, in one place.

The ``vllm:`` families copy vLLM 0.33 exactly (vllm/v1/metrics/buckets.py) so that vLLM's own dashboards
and recording rules work against the simulator unchanged. The ``gen_ai_*`` families follow the OTel GenAI
semantic-convention bucket advice. SLO thresholds are merged into the serving-layer families at start-up
(:func:`with_boundaries`) because a latency SLI is only exact when its threshold is a bucket boundary.
"""

from __future__ import annotations

from collections.abc import Iterable

# --- vLLM 0.33 families (upstream values; do not edit) -------------------------------------------------

VLLM_TIME_TO_FIRST_TOKEN: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""vLLM ``time_to_first_token`` family: sub-millisecond to 43 minutes (long queues)."""

VLLM_INTER_TOKEN_LATENCY: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""vLLM ``inter_token_latency`` family, shared by ITL and per-request TPOT."""

VLLM_REQUEST_LATENCY: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""vLLM ``request_latency`` family: e2e, queue, prefill, decode and inference time."""

VLLM_ITERATION_TOKENS: tuple[float, ...] = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
"""vLLM ``iteration_tokens`` family: tokens scheduled in one engine step."""

VLLM_KV_CACHE_RESIDENCY: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800,
)  # fmt: skip
"""vLLM ``kv_cache_residency`` family (21 bounds, 1 ms to 30 min): KV-block lifetime, idle-before-evict and
reuse-gap histograms."""

VLLM_REQUEST_PARAMS_N: tuple[float, ...] = (1, 2, 5, 10, 20)
VLLM_REQUEST_NUM_PREEMPTIONS: tuple[float, ...] = (1, 2, 3, 4, 5, 10, 20)


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to and including ``max_value`` (vLLM's token-count buckets).

    >>> build_1_2_5_buckets(100)
    [1, 2, 5, 10, 20, 50, 100]
    """
    if max_value < 1:
        raise ValueError(f"max_value must be >= 1, got {max_value}")
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


# --- sglang families (upstream values; do not edit) -----------------------------------------------------
# loadlens emits none of these: they shape the recorded sglang exposition of tests/fixtures/sglang/ and are
# sglang's defaults (python/sglang/srt/observability/metrics_collector.py, commit 44cedc2b9c7d).

SGLANG_TIME_TO_FIRST_TOKEN: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
)  # fmt: skip
SGLANG_E2E_REQUEST_LATENCY: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400,
)  # fmt: skip
SGLANG_INTER_TOKEN_LATENCY: tuple[float, ...] = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200,
    0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
SGLANG_QUEUE_TIME: tuple[float, ...] = (
    0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300, 400, 500, 600,
    700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000,
)  # fmt: skip
SGLANG_PER_STAGE_LATENCY: tuple[float, ...] = tuple(0.001 * 1.62**i for i in range(30))
"""``exponential_buckets(start=0.001, width=1.62, length=30)``: 1 ms to about 1191 s."""
SGLANG_NUM_RETRACTIONS: tuple[float, ...] = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 75, 100)


# --- OTel GenAI semantic-convention families (serving layer, every engine) -----------------------------

GEN_AI_SERVER_TIME_TO_FIRST_TOKEN: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
"""``gen_ai.server.time_to_first_token`` advice; SLO thresholds are merged in."""

GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
"""``gen_ai.server.time_per_output_token`` advice; SLO thresholds are merged in."""

GEN_AI_SERVER_REQUEST_DURATION: tuple[float, ...] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
"""``gen_ai.server.request.duration`` advice (powers of two from 10 ms)."""

GEN_AI_TOKEN_USAGE: tuple[float, ...] = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
"""``gen_ai.client.token.usage`` advice (powers of four)."""

# --- loadlens families ---------------------------------------------------------------------------------

LORA_SWAP_BLOCKING: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
)  # fmt: skip
"""Time one request waited because an adapter was being loaded (guide 2.4: 87 ms mean, 413 ms p99)."""

ENGINE_STEP_SECONDS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
"""Duration of one simulated engine step (batch forward pass)."""

TIMING_ERROR_SECONDS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0,
)  # fmt: skip
"""Lateness of the simulator's event loop against its schedule (the ≤ 2 ms p99 goal is a boundary; 0.25 s is
where the schedule restarts, and lateness of seconds (one step blocked by CPU starvation) still lands in a
finite bucket)."""

BUSY_IDLE_GAP_SECONDS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
)  # fmt: skip
"""Idle gaps between busy runs of the device (the busy timeline): 0.1 ms launch gaps between decode steps,
through the 15 ms off-half of a 29 ms swing (guide 2.2) and the 42 ms of an 84 ms one, to idle seconds."""

COLLECTOR_DURATION_SECONDS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def with_boundaries(base: Iterable[float], extra: Iterable[float]) -> tuple[float, ...]:
    """``base`` with every value of ``extra`` added as a boundary: sorted, deduplicated, finite.

    >>> with_boundaries((0.1, 0.5, 1.0), (0.2, 0.5))
    (0.1, 0.2, 0.5, 1.0)
    """
    values = sorted({float(v) for v in (*base, *extra)})
    if not values or values[0] <= 0:
        raise ValueError(f"bucket boundaries must be positive, got {values[:3]}")
    return tuple(values)


SIM_BATCH_SEQS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Sequences in one simulated engine step (powers of two up to vLLM's largest common max_num_seqs)."""

# --- load generator (client side, loadgen/) -------------------------------------------------------------

LOADGEN_TIME_TO_FIRST_TOKEN: tuple[float, ...] = (
    0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75,
    1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""Client TTFT: 10 ms steps up to the guide's 182 ms reference TTFT, then coarser out to long queues.
SLO thresholds are merged in at start-up (``with_boundaries``) so client goodput queries are exact."""

LOADGEN_INTER_TOKEN_LATENCY: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip
"""Client per-token ITL, chunk gaps and TPOT: sub-millisecond (proxies that batch chunks) through 10-50 ms
decode steps; finer than vLLM's ITL family, whose first boundary (10 ms) is the typical decode step itself."""

LOADGEN_REQUEST_DURATION: tuple[float, ...] = (
    0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
    90.0, 120.0, 180.0, 300.0, 600.0,
)  # fmt: skip
"""Client end-to-end latency: 256 tokens at 10-50 ms each is 2.5-13 s, so the 1-20 s range is dense."""

LOADGEN_DISPATCH_LAG: tuple[float, ...] = (
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Open-loop lateness of a send against its schedule: below 1 ms is healthy; seconds mean the sender pool
(max_concurrency) was exhausted and latencies include that wait (coordinated-omission correction)."""
