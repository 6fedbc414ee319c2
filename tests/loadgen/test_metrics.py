"""The loadgen /metrics collector: names, labels, seeded zeros, exact bucket counts and state gauges."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from loadgen.metrics import LiveState, LoadgenCollector, bucket_bounds
from loadgen.record import RequestRecord
from loadgen.store import Store
from loadlens.contracts.slo import load_slos

SLOS = load_slos()


def make() -> tuple[CollectorRegistry, LiveState]:
    store = Store(bucket_bounds(SLOS))
    store.seed([("s1", "interactive", "m"), ("s2", "interactive", "m")])
    state = LiveState(profile="p", version="1.0", locust_version="2.47.0", stages=["s1", "s2"], store=store)
    registry = CollectorRegistry()
    LoadgenCollector(state, registry=registry)
    return registry, state


def test_seeded_zeros_and_stage_gauge() -> None:
    registry, state = make()
    labels = {"stage": "s2", "priority_class": "interactive", "model_name": "m"}
    assert registry.get_sample_value("loadlens_client_requests_total", {**labels, "outcome": "success"}) == 0
    assert registry.get_sample_value("loadlens_client_time_to_first_token_seconds_count", labels) == 0
    assert registry.get_sample_value("loadlens_loadgen_stage", {"stage": "s1"}) == 0
    state.current_stage = "s1"
    assert registry.get_sample_value("loadlens_loadgen_stage", {"stage": "s1"}) == 1
    assert registry.get_sample_value("loadlens_loadgen_stage", {"stage": "s2"}) == 0
    assert registry.get_sample_value("loadlens_loadgen_results_valid") == 1
    assert (
        registry.get_sample_value(
            "loadlens_loadgen_info", {"profile": "p", "version": "1.0", "locust_version": "2.47.0"}
        )
        == 1
    )
    # Closed-loop series have no dispatch lag to show.
    assert registry.get_sample_value("loadlens_client_dispatch_lag_seconds_count", labels) is None


def test_histograms_counters_and_state() -> None:
    registry, state = make()
    cls = SLOS.class_for_priority(0)
    key = ("s1", "interactive", "m")
    for ttft in (0.05, 0.15, 0.25):
        state.store.record(
            RequestRecord(
                ttft=ttft, e2e=ttft + 0.02, output_tokens=3, prompt_tokens=9, itl=[(0.01, 2)], chunk_gaps=[0.02]
            ),
            key,
            cls,
        )
    state.store.record(RequestRecord(outcome="rate_limited"), key, cls)
    state.store.window_tokens["s1"] = 9
    state.cpu_ratio, state.results_valid, state.users = 0.95, False, 4
    labels = {"stage": "s1", "priority_class": "interactive", "model_name": "m"}
    bucket = "loadlens_client_time_to_first_token_seconds_bucket"
    # 0.2 s is the interactive TTFT SLO: an exact boundary, so the good share is exact.
    assert registry.get_sample_value(bucket, {**labels, "le": "0.2"}) == 2
    assert registry.get_sample_value(bucket, {**labels, "le": "+Inf"}) == 3
    assert registry.get_sample_value("loadlens_client_time_to_first_token_seconds_sum", labels) == 0.45
    assert registry.get_sample_value("loadlens_client_inter_token_latency_seconds_count", labels) == 6
    assert registry.get_sample_value("loadlens_client_inter_chunk_latency_seconds_count", labels) == 3
    assert registry.get_sample_value("loadlens_client_requests_total", {**labels, "outcome": "success"}) == 3
    assert registry.get_sample_value("loadlens_client_requests_total", {**labels, "outcome": "rate_limited"}) == 1
    assert registry.get_sample_value("loadlens_client_output_tokens_total", labels) == 9
    assert registry.get_sample_value("loadlens_client_goodput_requests_total", labels) == 2
    assert registry.get_sample_value("loadlens_client_sla_breaches_total", {**labels, "slo": "ttft"}) == 1
    assert registry.get_sample_value("loadlens_client_streamed_tokens_total", {"stage": "s1"}) == 9
    assert registry.get_sample_value("loadlens_loadgen_cpu_ratio") == 0.95
    assert registry.get_sample_value("loadlens_loadgen_results_valid") == 0
    assert registry.get_sample_value("loadlens_loadgen_users") == 4


def test_names_follow_the_conventions() -> None:
    registry, state = make()
    state.fairness = {"s1": 0.9}
    text = generate_latest(registry).decode()
    names = {line.split(" ")[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert all(n.startswith(("loadlens_client_", "loadlens_loadgen_")) for n in names)
    assert "loadlens_client_jain_fairness_index" in names
    for line in text.splitlines():
        if line.startswith("# TYPE") and line.endswith(" counter"):
            continue
        if line.startswith("# TYPE"):
            assert not line.split(" ")[2].endswith("_total"), line  # _total only on counters
