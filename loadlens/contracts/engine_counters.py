"""vLLM's cumulative engine series (counters and the ``_sum``/``_count`` of its histograms) as increases over
a run's measured window, read by the experiment's ``/metrics`` sampler (loadlens/experiment/sampler.py).

What ``loadlens calibrate`` fits a step-time model to beside the client's figures (docs/calibration.md):
how many engine steps ran (``vllm:iteration_tokens_total_count``) and how many tokens they carried
(``..._sum``), how long requests spent queued, in prefill and in decode (``vllm:request_*_time_seconds``), the
tokens and requests, and the prompt tokens looked up in and served from the prefix cache (a calibration
stage's prompts must miss it). Each value is summed over label sets (engines, models); the increase is, per measured
window, the last sample inside it minus the first, summed over the windows. A series absent from every sample
inside a window is absent from the result (never 0).

Usage::

    values = parse_engine_counters(text)              # one scrape
    increases = counter_increases(samples, windows)   # samples: [(unix_ts, values), ...]
"""

from __future__ import annotations

HISTOGRAMS = (
    "vllm:iteration_tokens_total",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
)
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
"""Prompt tokens looked up in the prefix cache."""
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
"""Prompt tokens the prefix cache served."""
COUNTERS = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:num_preemptions_total",
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
)
ENGINE_COUNTERS: frozenset[str] = frozenset(
    [f"{h}_sum" for h in HISTOGRAMS] + [f"{h}_count" for h in HISTOGRAMS] + list(COUNTERS)
)
"""The exposed sample names kept (histograms by ``_sum`` and ``_count``)."""
BUCKETED = "vllm:iteration_tokens_total_bucket"
"""The one histogram whose buckets are kept too, as ``NAME{le="EDGE"}`` (EDGE as exposed): how many steps
carried at most EDGE tokens, which tells decode-only steps from steps that admitted a prompt."""


def bucket_key(le: str) -> str:
    return f'{BUCKETED}{{le="{le}"}}'


def bucket_counts(values: dict[str, float]) -> list[tuple[float, float]]:
    """(edge, cumulative count) of the kept buckets, by edge (``+Inf`` last)."""
    out = []
    prefix = f'{BUCKETED}{{le="'
    for key, count in values.items():
        if key.startswith(prefix):
            out.append((float(key[len(prefix) : -2]), count))
    return sorted(out)


def parse_engine_counters(text: str) -> dict[str, float]:
    """Each kept sample name's value in an exposition, summed over its label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace, space = line.find("{"), line.find(" ")
        name = line[:brace] if 0 <= brace < space or (brace >= 0 and space < 0) else line[:space]
        if name == BUCKETED:
            at = line.find('le="', brace)
            if at < 0:
                continue
            name = bucket_key(line[at + 4 : line.find('"', at + 4)])
        elif name not in ENGINE_COUNTERS:
            continue
        rest = line[line.rfind("}") + 1 :] if brace >= 0 else line[space:]
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + value
    return out


SPAN = "seconds"
"""The key of :func:`counter_increases`' result that holds the time its increases cover: per window, last
sample minus first, summed (the sampler's first and last readings inside a stage miss up to one interval at
each edge, so rates divide by this, not by the stage's length)."""


def counter_increases(
    samples: list[tuple[float, dict[str, float]]], windows: list[tuple[float, float]]
) -> dict[str, float]:
    """Per window the last sample inside it minus the first, summed over the windows; a name needs two
    samples inside some window that both carry it. ``SPAN`` holds the seconds covered (absent when no window
    had two samples)."""
    out: dict[str, float] = {}
    for lo, hi in windows:
        stamped = [(ts, values) for ts, values in samples if lo <= ts <= hi]
        if len(stamped) < 2:
            continue
        (t_first, first), (t_last, last) = stamped[0], stamped[-1]
        out[SPAN] = out.get(SPAN, 0.0) + t_last - t_first
        for name in sorted(set(first) & set(last)):
            out[name] = out.get(name, 0.0) + last[name] - first[name]
    return out
