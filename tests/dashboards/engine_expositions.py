"""The recorded engine expositions of tests/fixtures/sglang/: one modelled workload, scraped every 15 s for
5 minutes, written once in sglang's metric dialect and once in vLLM's, as OpenMetrics text with timestamps
(``promtool tsdb create-blocks-from openmetrics`` loads them). Regenerate after an intended change::

    .venv/bin/python -m tests.dashboards.engine_expositions     # rewrites tests/fixtures/sglang/*.om

The workload (seeded, deterministic): arrivals at 3, then 6, then 2 requests/s (100 s each) into an engine
of 24 running slots and a 40,000-token KV pool. The middle phase is past its capacity: the queue grows, some
requests are retracted (preempted) and recomputed, and 2 % of requests are aborted by their client while
decoding. Each request's times (queue, prefill, per-token gaps, end) are computed once, so both dialects
describe the same requests: equal gauges, equal counters, equal histogram sums and counts.

sglang's side follows sgl-project/sglang's collectors at the commit named in loadlens/contracts/engine_series.py:
names, types, label sets (scheduler: model_name, engine_type, tp_rank, pp_rank, moe_ep_rank; tokenizer:
model_name, engine_type), the default buckets (loadlens/contracts/buckets.py, SGLANG_*), what appears only
once observed, and no ``_created`` samples (sglang serves its metrics in prometheus_client's multiprocess
mode, which has none). vLLM's side is vLLM 0.33's (docs/sim-engine.md §9). HELP texts are ours. The fixture
holds what the server exposes; Prometheus adds ``job`` and ``instance`` when it scrapes, and so does the test.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.utils import floatToGoString

from loadlens.contracts import buckets as b

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"
SGLANG_FILE = FIXTURES / "sglang.om"
VLLM_FILE = FIXTURES / "vllm.om"

MODEL = "qwen2.5-1.5b"
START = 1_780_000_000  # 2026-05-28T20:26:40Z; any fixed instant
SCRAPE_INTERVAL = 15  # Prometheus's default; Grafana's $__rate_interval is then 1m
DURATION = 300
PHASES = ((100, 3.0), (100, 6.0), (100, 2.0))  # (seconds, arrivals per second)
SLOTS = 24
KV_TOKENS = 40_000
SYSTEM_PROMPT = 256  # tokens shared by every request (a prefix-cache hit after the first)
ABORT_SHARE = 0.02
SEED = 16


def _go(value: float) -> str:
    """A number as prometheus_client writes it (``1.0``, ``+Inf``)."""
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


SCHEDULER = {"model_name": MODEL, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
TOKENIZER = {"model_name": MODEL, "engine_type": "unified"}
VLLM = {"model_name": MODEL, "engine": "0"}


@dataclass
class Request:
    arrival: float
    prompt: int
    cached: int
    output: int  # tokens generated (fewer when aborted)
    finish: str  # stop, length or abort
    admitted: float = 0.0
    first_token: float = 0.0
    token_times: list[float] = field(default_factory=list)
    end: float = 0.0
    retraction: float | None = None  # when it was retracted (once at most)
    gap: float = 0.0  # between output tokens
    pause: float = 0.0  # the retraction's: added to the gap before token_times[retracted_token]
    retracted_token: int | None = None

    @property
    def prefill(self) -> float:
        return self.first_token - self.admitted


def workload(seed: int = SEED) -> list[Request]:
    rng = random.Random(seed)
    arrivals: list[float] = []
    t0 = 0.0
    for seconds, per_second in PHASES:
        t = t0
        while True:
            t += rng.expovariate(per_second)
            if t >= t0 + seconds:
                break
            arrivals.append(t)
        t0 += seconds
    free = [0.0] * SLOTS  # when each slot is next free
    requests = []
    for i, arrival in enumerate(arrivals):
        prompt = SYSTEM_PROMPT + rng.randint(200, 1200)
        cached = SYSTEM_PROMPT if i > 0 and rng.random() < 0.8 else 0
        output = rng.randint(50, 300)
        finish = "stop" if rng.random() < 0.6 else "length"
        aborted = rng.random() < ABORT_SHARE
        abort_at = rng.uniform(0.2, 0.8)
        retract_draw = rng.random()
        slot_free = heapq.heappop(free)
        admitted = max(arrival + 0.0005, slot_free)  # 0.5 ms from arrival to the wait queue
        running = SLOTS - sum(1 for f in free if f <= admitted)  # the other slots' requests, and this one
        queued = bisect.bisect_right(arrivals, admitted) - i - 1  # arrived and waiting behind it
        prefill = 0.015 + (prompt - cached) / 20_000
        gap = 0.012 + 0.0008 * running  # decode slows as the batch grows
        r = Request(arrival, prompt, cached, output, finish, admitted=admitted, first_token=admitted + prefill, gap=gap)
        t = r.first_token
        # Past capacity (a long queue) some running requests are retracted for KV space: they pause and
        # recompute their prompt and what they had generated.
        retract_after = output // 2 if queued > SLOTS // 2 and retract_draw < 0.15 else None
        if aborted:
            r.output = max(2, int(output * abort_at))
            r.finish = "abort"
        for k in range(1, r.output):
            if retract_after is not None and k == retract_after:
                r.retraction, r.pause, r.retracted_token = t, 0.5 + (prompt + k) / 20_000, len(r.token_times)
                t += r.pause
            t += gap
            r.token_times.append(t)
        r.end = t
        heapq.heappush(free, r.end)
        requests.append(r)
    return requests


# --- series state ---------------------------------------------------------------------------------------


class Histogram:
    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += times
                break
        else:
            self.counts[-1] += times
        self.sum += value * times

    def samples(self, name: str) -> list[tuple[str, dict[str, str], float]]:
        out: list[tuple[str, dict[str, str], float]] = []
        total = 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += count
            out.append((f"{name}_bucket", {"le": _go(bound)}, total))
        out.append((f"{name}_count", {}, total))
        out.append((f"{name}_sum", {}, self.sum))
        return out


Labels = dict[str, str]
Event = tuple[float, Callable[[], None]]


@dataclass
class Family:
    name: str  # the family name (counters without _total)
    kind: str
    help: str
    # label set (as a tuple) -> points (timestamp, [(sample name, extra labels, value)])
    points: dict[tuple[tuple[str, str], ...], list[tuple[int, list[tuple[str, Labels, float]]]]] = field(
        default_factory=dict
    )

    def add(self, labels: Labels, ts: int, samples: list[tuple[str, Labels, float]]) -> None:
        self.points.setdefault(tuple(labels.items()), []).append((ts, samples))

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        for labels, points in self.points.items():
            for ts, samples in points:
                for sample, extra, value in samples:
                    pairs = [*labels, *extra.items()]
                    text = ",".join(f'{k}="{v}"' for k, v in pairs)
                    lines.append(f"{sample}{{{text}}} {_go(value)} {ts}")
        return lines


class Exposition:
    """Series observed over time; ``scrape(t)`` records what a scrape at ``t`` would read."""

    def __init__(self) -> None:
        self.families: dict[str, Family] = {}
        self.gauges: list[tuple[str, Labels, Callable[[float], float]]] = []
        self.counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.hists: dict[tuple[str, tuple[tuple[str, str], ...]], Histogram] = {}
        self.events: list[tuple[float, int, Callable[[], None]]] = []

    def family(self, name: str, kind: str, help: str) -> None:
        self.families[name] = Family(name, kind, help)

    def gauge(self, name: str, labels: Labels, value: Callable[[float], float]) -> None:
        self.gauges.append((name, labels, value))

    def counter(self, name: str, labels: Labels, at: float | None = None, by: float = 0.0) -> None:
        """Adds ``by`` at ``at``; with ``at`` None the series exists from the start (created at 0)."""
        key = (name, tuple(labels.items()))
        if at is None:
            self.counters.setdefault(key, 0.0)
            return

        def inc() -> None:
            self.counters[key] = self.counters.get(key, 0.0) + by

        self._event(at, inc)

    def histogram(
        self, name: str, labels: Labels, bounds: Sequence[float], at: float, value: float, times: int = 1
    ) -> None:
        key = (name, tuple(labels.items()))

        def observe() -> None:
            self.hists.setdefault(key, Histogram(bounds)).observe(value, times)

        self._event(at, observe)

    def _event(self, at: float, apply: Callable[[], None]) -> None:
        self.events.append((at, len(self.events), apply))

    def record(self, scrape_times: Iterable[float]) -> str:
        events = sorted(self.events, key=lambda e: (e[0], e[1]))
        i = 0
        for t in scrape_times:
            while i < len(events) and events[i][0] <= t:
                events[i][2]()
                i += 1
            ts = START + round(t)
            for name, labels, value in self.gauges:
                self.families[name].add(labels, ts, [(name, {}, value(t))])
            for (name, key), total in self.counters.items():
                self.families[name.removesuffix("_total")].add(dict(key), ts, [(name, {}, total)])
            for (name, key), hist in self.hists.items():
                self.families[name].add(dict(key), ts, hist.samples(name))
        body = [line for f in self.families.values() if f.points for line in f.render()]
        return "\n".join([*body, "# EOF"]) + "\n"


# --- the workload as each engine reports it -------------------------------------------------------------


class Timeline:
    def __init__(self, requests: list[Request]) -> None:
        self.requests = requests
        self._tokens = sorted(x for r in requests for x in (r.first_token, *r.token_times))

    def running(self, t: float) -> list[Request]:
        return [r for r in self.requests if r.admitted <= t < r.end]

    def waiting(self, t: float) -> int:
        return sum(1 for r in self.requests if r.arrival <= t < r.admitted)

    def used_tokens(self, t: float) -> int:
        return sum(r.prompt + (r.first_token <= t) + bisect.bisect_right(r.token_times, t) for r in self.running(t))

    def kv_usage(self, t: float) -> float:
        return round(self.used_tokens(t) / KV_TOKENS, 4)

    def generated(self, lo: float, hi: float) -> int:
        return bisect.bisect_right(self._tokens, hi) - bisect.bisect_right(self._tokens, lo)

    def prefills(self, lo: float, hi: float) -> list[Request]:
        return [r for r in self.requests if lo < r.first_token <= hi]

    def retracted(self, lo: float, hi: float) -> int:
        return sum(1 for r in self.requests if r.retraction is not None and lo < r.retraction <= hi)


def _gaps_by_scrape(r: Request) -> list[tuple[float, float, int]]:
    """The token gaps of ``r`` (every output token after the first) as (scrape time, gap, how many): what
    each scrape sees of them."""
    times, out = r.token_times, []
    lo = 0
    hi_time = math.ceil(times[0] / SCRAPE_INTERVAL) * SCRAPE_INTERVAL if times else 0
    while lo < len(times):
        hi = bisect.bisect_right(times, hi_time, lo)
        n = hi - lo
        if r.retracted_token is not None and lo <= r.retracted_token < hi:
            out.append((float(hi_time), r.gap + r.pause, 1))
            n -= 1
        if n:
            out.append((float(hi_time), r.gap, n))
        lo, hi_time = hi, hi_time + SCRAPE_INTERVAL
    return out


def _steps(tl: Timeline, lo: float, hi: float) -> tuple[int, int, list[int]]:
    """Engine steps in (lo, hi]: decode steps, prefill steps, and the tokens of each step (vLLM's
    iteration_tokens). A step lasts the running requests' mean token gap."""
    running = tl.running(hi)
    if not running:
        return 0, 0, []
    step = sum(r.gap for r in running) / len(running)
    steps = max(1, round((hi - lo) / step))
    prefills = tl.prefills(lo, hi)
    decode_steps = max(0, steps - len(prefills))
    tokens = [len(running)] * decode_steps + [len(running) + r.prompt - r.cached for r in prefills]
    return decode_steps, len(prefills), tokens


def sglang(tl: Timeline) -> Exposition:
    x = Exposition()
    s, k = SCHEDULER, TOKENIZER
    interval = SCRAPE_INTERVAL

    def hit_rate(t: float) -> float:
        done = tl.prefills(t - interval, t)
        total = sum(r.prompt for r in done)
        return round(sum(r.cached for r in done) / total, 4) if total else 0.0

    for name, help, value in (
        ("sglang:num_running_reqs", "Requests in the running batch.", lambda t: float(len(tl.running(t)))),
        ("sglang:num_used_tokens", "KV pool token slots in use.", lambda t: float(tl.used_tokens(t))),
        ("sglang:token_usage", "Share of the KV pool in use (0-1).", tl.kv_usage),
        ("sglang:pending_prealloc_token_usage", "Share pre-allocated for P/D transfers.", lambda t: 0.0),
        ("sglang:swa_token_usage", "Share of the sliding-window pool in use.", lambda t: 0.0),
        ("sglang:mamba_usage", "Share of the Mamba state pool in use.", lambda t: 0.0),
        ("sglang:decode_sum_seq_lens", "Sum of the decode batch's lengths.", lambda t: float(tl.used_tokens(t))),
        ("sglang:gen_throughput", "Output tokens/s over the last log interval.",
         lambda t: round(tl.generated(t - interval, t) / interval, 2)),
        ("sglang:num_queue_reqs", "Requests in the waiting queue.", lambda t: float(tl.waiting(t))),
        ("sglang:num_grammar_queue_reqs", "Requests waiting for a grammar.", lambda t: 0.0),
        ("sglang:num_running_reqs_offline_batch", "Running offline-batch requests.", lambda t: 0.0),
        ("sglang:cache_hit_rate", "Prefix-cache hit share of the last prefill batches.", hit_rate),
        ("sglang:max_total_num_tokens", "KV pool size in tokens.", lambda t: float(KV_TOKENS)),
        ("sglang:spec_accept_length", "Speculative decoding acceptance length.", lambda t: 0.0),
        ("sglang:spec_accept_rate", "Speculative decoding acceptance rate.", lambda t: 0.0),
        ("sglang:num_retracted_reqs", "Requests retracted in the last log interval.",
         lambda t: float(tl.retracted(t - interval, t))),
        ("sglang:num_paused_reqs", "Requests paused by weight sync.", lambda t: 0.0),
        ("sglang:num_prefill_prealloc_queue_reqs", "P/D prefill pre-allocation queue.", lambda t: 0.0),
        ("sglang:num_prefill_inflight_queue_reqs", "P/D prefill in-flight queue.", lambda t: 0.0),
        ("sglang:num_decode_prealloc_queue_reqs", "P/D decode pre-allocation queue.", lambda t: 0.0),
        ("sglang:num_decode_transfer_queue_reqs", "P/D decode transfer queue.", lambda t: 0.0),
        ("sglang:kv_transfer_speed_gb_s", "P/D KV transfer speed, GB/s.", lambda t: 0.0),
        ("sglang:kv_transfer_latency_ms", "P/D KV transfer latency, ms.", lambda t: 0.0),
        ("sglang:kv_transfer_bootstrap_ms", "P/D KV transfer bootstrap time, ms.", lambda t: 0.0),
        ("sglang:kv_transfer_alloc_ms", "P/D KV transfer allocation wait, ms.", lambda t: 0.0),
        ("sglang:kv_transfer_total_mb", "P/D KV transferred, MB.", lambda t: 0.0),
        ("sglang:engine_startup_time", "Engine start-up time, s.", lambda t: 41.7),
        ("sglang:engine_load_weights_time", "Weight loading time, s.", lambda t: 9.8),
        ("sglang:new_token_ratio", "The scheduler's estimate of output still to come.",
         lambda t: 0.1 if tl.retracted(t - 60, t) == 0 else 0.7),
        ("sglang:is_cuda_graph", "Whether the last batch ran as a CUDA graph.", lambda t: 1.0),
        ("sglang:num_unique_running_routing_keys", "Routing keys in the running batch.", lambda t: 0.0),
    ):  # fmt: skip
        x.family(name, "gauge", help)
        x.gauge(name, s, value)
    x.family("sglang:cache_config_info", "gauge", "KV cache configuration.")
    x.gauge("sglang:cache_config_info", {"page_size": "1", "num_pages": str(KV_TOKENS)}, lambda t: 1.0)

    for name, help in (
        ("sglang:num_retracted_requests", "Requests retracted."),
        ("sglang:num_retracted_input_tokens", "Prompt tokens of retracted requests."),
        ("sglang:num_retracted_output_tokens", "Output tokens of retracted requests."),
        ("sglang:realtime_tokens", "Tokens processed, by mode."),
        ("sglang:cuda_graph_passes", "Decode forward passes, by CUDA graph use."),
        ("sglang:prompt_tokens", "Prompt tokens of finished requests."),
        ("sglang:generation_tokens", "Output tokens of finished requests."),
        ("sglang:cached_tokens", "Prompt tokens served from a cache, by source."),
        ("sglang:num_requests", "Finished requests."),
        ("sglang:num_aborted_requests", "Aborted requests."),
    ):
        x.family(name, "counter", help)
    for name, help in (
        ("sglang:queue_time_seconds", "Wait-queue entry to first forward pass."),
        ("sglang:per_stage_req_latency_seconds", "Latency of each request stage."),
        ("sglang:time_to_first_token_seconds", "Request creation to first token."),
        ("sglang:inter_token_latency_seconds", "Gap between output tokens."),
        ("sglang:e2e_request_latency_seconds", "Request creation to finish."),
        ("sglang:num_retractions", "Retractions per finished request."),
    ):
        x.family(name, "histogram", help)

    for r in tl.requests:
        stage = {**s, "stage": "request_process"}
        x.histogram(
            "sglang:per_stage_req_latency_seconds", stage, b.SGLANG_PER_STAGE_LATENCY, r.arrival + 0.0005, 0.0005
        )
        x.histogram("sglang:queue_time_seconds", s, b.SGLANG_QUEUE_TIME, r.admitted, r.admitted - r.arrival - 0.0005)
        stage = {**s, "stage": "prefill_forward"}
        x.histogram("sglang:per_stage_req_latency_seconds", stage, b.SGLANG_PER_STAGE_LATENCY, r.first_token, r.prefill)
        x.histogram("sglang:time_to_first_token_seconds", k, b.SGLANG_TIME_TO_FIRST_TOKEN, r.first_token,
                    r.first_token - r.arrival)  # fmt: skip
        for at, gap, n in _gaps_by_scrape(r):
            x.histogram("sglang:inter_token_latency_seconds", k, b.SGLANG_INTER_TOKEN_LATENCY, at, gap, n)
        x.counter("sglang:realtime_tokens_total", {**s, "mode": "prefill_compute"}, r.first_token, r.prompt - r.cached)
        if r.cached:
            x.counter("sglang:realtime_tokens_total", {**s, "mode": "prefill_cache"}, r.first_token, r.cached)
        if r.retraction is not None:
            done = sum(1 for t in r.token_times if t <= r.retraction)
            x.counter("sglang:num_retracted_requests_total", s, r.retraction, 1)
            x.counter("sglang:num_retracted_input_tokens_total", s, r.retraction, r.prompt)
            x.counter("sglang:num_retracted_output_tokens_total", s, r.retraction, done + 1)
        if r.finish == "abort":
            x.counter("sglang:num_aborted_requests_total", k, r.end, 1)
            continue
        x.histogram("sglang:e2e_request_latency_seconds", k, b.SGLANG_E2E_REQUEST_LATENCY, r.end, r.end - r.arrival)
        x.histogram("sglang:num_retractions", k, b.SGLANG_NUM_RETRACTIONS, r.end, 0 if r.retraction is None else 1)
        x.counter("sglang:prompt_tokens_total", k, r.end, r.prompt)
        x.counter("sglang:generation_tokens_total", k, r.end, r.output)
        if r.cached:
            x.counter("sglang:cached_tokens_total", {**k, "cache_source": "device"}, r.end, r.cached)
        x.counter("sglang:num_requests_total", k, r.end, 1)
    for lo in range(0, DURATION, SCRAPE_INTERVAL):
        hi = lo + SCRAPE_INTERVAL
        decode_steps, _, _ = _steps(tl, lo, hi)
        x.counter("sglang:realtime_tokens_total", {**s, "mode": "decode"}, hi, tl.generated(lo, hi))
        x.counter("sglang:cuda_graph_passes_total", {**s, "mode": "decode_cuda_graph"}, hi, decode_steps)
    # sglang's retraction counters are created on first use; so are the others, but every one of them is
    # used within the first seconds here.
    return x


def vllm(tl: Timeline) -> Exposition:
    x = Exposition()
    v = VLLM
    for name, help, value in (
        ("vllm:num_requests_running", "Requests in the running batch.", lambda t: float(len(tl.running(t)))),
        ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", lambda t: float(tl.waiting(t))),
        ("vllm:kv_cache_usage_perc", "KV cache usage (0-1).", tl.kv_usage),
    ):
        x.family(name, "gauge", help)
        x.gauge(name, v, value)
    x.family("vllm:num_requests_waiting_by_reason", "gauge", "Waiting requests by reason.")
    x.gauge("vllm:num_requests_waiting_by_reason", {**v, "reason": "capacity"}, lambda t: float(tl.waiting(t)))
    x.gauge("vllm:num_requests_waiting_by_reason", {**v, "reason": "deferred"}, lambda t: 0.0)
    for name, help in (
        ("vllm:prompt_tokens", "Prefill tokens processed."),
        ("vllm:generation_tokens", "Generation tokens processed."),
        ("vllm:num_preemptions", "Preemptions (recompute)."),
        ("vllm:prefix_cache_queries", "Prefix-cache lookups, tokens."),
        ("vllm:prefix_cache_hits", "Prefix-cache hits, tokens."),
        ("vllm:request_success", "Finished requests by finish reason."),
        ("vllm:admission_rejections", "Requests refused at admission."),
    ):
        x.family(name, "counter", help)
    # vLLM creates these label sets at start-up, at 0.
    for series in ("prompt_tokens", "generation_tokens", "num_preemptions", "prefix_cache_queries"):
        x.counter(f"vllm:{series}_total", v)
    x.counter("vllm:prefix_cache_hits_total", v)
    for reason in ("stop", "length", "abort", "error", "repetition"):
        x.counter("vllm:request_success_total", {**v, "finished_reason": reason})
    for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
        x.counter("vllm:admission_rejections_total", {"model_name": MODEL, "reason": reason})
    for name, help in (
        ("vllm:time_to_first_token_seconds", "Arrival to first token."),
        ("vllm:inter_token_latency_seconds", "Gap between output steps."),
        ("vllm:e2e_request_latency_seconds", "Arrival to last token."),
        ("vllm:request_queue_time_seconds", "Queued to first scheduled."),
        ("vllm:request_prefill_time_seconds", "First scheduled to first token."),
        ("vllm:request_decode_time_seconds", "First token to last token."),
        ("vllm:iteration_tokens_total", "Tokens per engine step."),
    ):
        x.family(name, "histogram", help)
    for r in tl.requests:
        # Iteration stats (TTFT, token gaps) as they happen, aborted requests' too; request stats at the end.
        x.histogram("vllm:time_to_first_token_seconds", v, b.VLLM_TIME_TO_FIRST_TOKEN, r.first_token,
                    r.first_token - r.arrival)  # fmt: skip
        for at, gap, n in _gaps_by_scrape(r):
            x.histogram("vllm:inter_token_latency_seconds", v, b.VLLM_INTER_TOKEN_LATENCY, at, gap, n)
        x.counter("vllm:prompt_tokens_total", v, r.first_token, r.prompt)
        x.counter("vllm:prefix_cache_queries_total", v, r.first_token, r.prompt)
        x.counter("vllm:prefix_cache_hits_total", v, r.first_token, r.cached)
        x.counter("vllm:generation_tokens_total", v, r.end, r.output)
        if r.retraction is not None:
            x.counter("vllm:num_preemptions_total", v, r.retraction, 1)
        x.counter("vllm:request_success_total", {**v, "finished_reason": r.finish}, r.end, 1)
        if r.finish == "abort":
            continue  # vLLM records aborted requests in no histogram
        lat = b.VLLM_REQUEST_LATENCY
        x.histogram("vllm:request_queue_time_seconds", v, lat, r.end, r.admitted - r.arrival - 0.0005)
        x.histogram("vllm:request_prefill_time_seconds", v, lat, r.end, r.prefill)
        x.histogram("vllm:request_decode_time_seconds", v, lat, r.end, r.end - r.first_token)
        x.histogram("vllm:e2e_request_latency_seconds", v, lat, r.end, r.end - r.arrival)
    for lo in range(0, DURATION, SCRAPE_INTERVAL):
        hi = lo + SCRAPE_INTERVAL
        for tokens in _steps(tl, lo, hi)[2]:
            x.histogram("vllm:iteration_tokens_total", v, b.VLLM_ITERATION_TOKENS, hi, tokens)
    return x


def render() -> dict[Path, str]:
    tl = Timeline(workload())
    times = [float(t) for t in range(0, DURATION + 1, SCRAPE_INTERVAL)]
    return {SGLANG_FILE: sglang(tl).record(times), VLLM_FILE: vllm(tl).record(times)}


def main() -> int:
    for path, text in render().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
