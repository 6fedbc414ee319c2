"""The /metrics sampler reads an sglang server as it reads a vLLM one: the recorded expositions of
tests/fixtures/sglang/ (one modelled workload in each dialect), scrape by scrape, give the running,
waiting, KV-usage and preemption figures the workload's own timeline has, through the one mapping
(loadlens/contracts/engine_series.py). The sampler reads ``GET /metrics`` itself (no Prometheus), so the
recording is served as the engine would have answered each scrape."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from functools import cache

import pytest

from loadlens.contracts.engine_series import BY_VLLM
from loadlens.contracts.kv_capacity import KvCapacity, parse_kv_capacity
from loadlens.experiment.sampler import SAMPLED, SERIES, ServerSampler, parse_exposition
from tests.dashboards import engine_expositions as rec
from tests.support.recorded_engines import scrapes

# The overload phase (arrivals at 6/s from 100 s to 200 s), as scrape times of the recording.
OVERLOAD = (rec.START + 105, rec.START + 195)


@cache
def timeline() -> rec.Timeline:
    return rec.Timeline(rec.workload())


def expected(ts: int) -> dict[str, float]:
    """What the workload says at one scrape (the generator's timeline, not the exposition)."""
    t = ts - rec.START
    tl = timeline()
    return {
        "running": float(len(tl.running(t))),
        "waiting": float(tl.waiting(t)),
        "kv_cache_usage": tl.kv_usage(t),
        "preemptions": float(sum(1 for r in tl.requests if r.retraction is not None and r.retraction <= t)),
    }


def test_series_names_come_from_the_mapping() -> None:
    assert SERIES == {
        "vllm:num_requests_running": "running",
        "sglang:num_running_reqs": "running",
        "vllm:num_requests_waiting": "waiting",
        "sglang:num_queue_reqs": "waiting",
        "vllm:kv_cache_usage_perc": "kv_cache_usage",
        "sglang:token_usage": "kv_cache_usage",
        "vllm:num_preemptions_total": "preemptions",
        "sglang:num_retracted_requests_total": "preemptions",
    }
    for key, (vllm, _) in SAMPLED.items():
        counterpart = BY_VLLM[vllm].sglang
        assert counterpart is not None and SERIES[counterpart.name] == key


@pytest.mark.parametrize("dialect", ["sglang", "vllm"])
def test_every_scrape_reads_the_workload(dialect: str) -> None:
    recorded = scrapes(dialect)
    assert len(recorded) == rec.DURATION // rec.SCRAPE_INTERVAL + 1
    first_retraction = min(r.retraction for r in timeline().requests if r.retraction is not None)
    for ts, text in recorded.items():
        want = expected(ts)
        if dialect == "sglang" and ts - rec.START < first_retraction:
            del want["preemptions"]  # sglang creates the counter at the first retraction
        assert parse_exposition(text) == want, ts


def test_an_sglang_run_summarises_like_the_same_vllm_run() -> None:
    summaries = {}
    for dialect in ("sglang", "vllm"):
        sampler = ServerSampler("http://127.0.0.1:9")
        sampler.samples = [(float(ts), parse_exposition(text)) for ts, text in scrapes(dialect).items()]
        summaries[dialect] = sampler.summary([OVERLOAD])
    inside = [expected(ts) for ts in range(OVERLOAD[0], OVERLOAD[1] + 1, rec.SCRAPE_INTERVAL)]
    s = summaries["sglang"]
    assert s.samples == 7
    assert s.mean_running == pytest.approx(sum(x["running"] for x in inside) / 7, rel=1e-12)
    assert s.peak_running == 24.0  # the engine's 24 slots
    assert s.peak_waiting == max(x["waiting"] for x in inside) and s.peak_waiting > 100
    assert s.peak_kv_cache_usage == max(x["kv_cache_usage"] for x in inside)
    assert s.preemptions == inside[-1]["preemptions"] - inside[0]["preemptions"] and s.preemptions > 0
    assert s == summaries["vllm"]


def test_a_counter_created_inside_the_window_counts_from_zero() -> None:
    """sglang's retraction counter appears at the first retraction: what it counted then is in the increase."""
    sampler = ServerSampler("http://127.0.0.1:9")
    sampler.samples = [(1.0, {"running": 1.0}), (2.0, {"running": 2.0, "preemptions": 3.0}),
                       (3.0, {"running": 2.0, "preemptions": 5.0})]  # fmt: skip
    assert sampler.summary([(0.0, 4.0)]).preemptions == 5.0
    assert sampler.summary([(1.5, 4.0)]).preemptions == 2.0
    assert sampler.summary([(2.5, 4.0)]).preemptions is None  # one sample of a counter: no increase
    assert sampler.summary([(0.0, 1.5)]).preemptions is None  # never seen (an older sglang has no counter)


def test_labels_with_braces_and_timestamps() -> None:
    text = (
        'sglang:num_queue_reqs{model_name="a}b c",tp_rank="0"} 4.0 1780000015\n'
        'sglang:num_queue_reqs{model_name="x\\"}",tp_rank="1"} 3.0\n'
        'sglang:token_usage{dp_rank="0"} 0.25\n'
        'sglang:token_usage{dp_rank="1"} 0.5\n'
        'sglang:num_running_reqs 7 # {trace_id="t"} 1.0\n'
    )
    assert parse_exposition(text) == {"waiting": 7.0, "kv_cache_usage": 0.5, "running": 7.0}


@pytest.fixture
def sglang_server() -> Iterator[str]:
    """Answers ``GET /metrics`` with the recording's scrapes in order, then the last one again."""
    texts = list(scrapes("sglang").values())
    served = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = texts[min(served[0], len(texts) - 1)].encode()
            served[0] += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_the_sampler_reads_a_live_sglang_metrics_endpoint(sglang_server: str) -> None:
    n = len(scrapes("sglang"))
    with ServerSampler(sglang_server, interval=0.01) as sampler:
        deadline = time.monotonic() + 30
        while len(sampler.samples) < n and time.monotonic() < deadline:
            time.sleep(0.02)
    assert sampler.errors == []
    got = [s for _, s in sampler.samples[:n]]
    assert got == [parse_exposition(t) for t in scrapes("sglang").values()]
    assert got[-1] == expected(rec.START + rec.DURATION)


def test_the_kv_capacity_the_server_states_inside_the_windows() -> None:
    """``vllm:cache_config_info``'s capacity in the last sample inside the windows that states one; sglang
    states none (its recording has no such series), so the fields stay None, never 0."""
    sampler = ServerSampler("http://127.0.0.1:9")
    sampler.capacity_samples = [(1.0, KvCapacity(100, 16)), (2.0, KvCapacity(200, 16)), (3.0, None),
                                (5.0, KvCapacity(300, 128))]  # fmt: skip
    summary = sampler.summary([(1.5, 4.0)])
    assert (summary.kv_cache_blocks, summary.kv_cache_block_size) == (200, 16)
    assert (sampler.summary([(2.5, 3.5)]).kv_cache_blocks, sampler.summary([(4.0, 6.0)]).kv_cache_block_size) == (
        None,
        128,
    )
    assert all(parse_kv_capacity(text) is None for text in scrapes("sglang").values())
