"""The progress line: exact text for an empty stage and for one with finished requests."""

from __future__ import annotations

from loadgen.metrics import bucket_bounds
from loadgen.profile import Stage
from loadgen.progress import progress_line
from loadgen.record import RequestRecord
from loadgen.store import Store
from loadlens.contracts.slo import load_slos


def test_nothing_finished_yet() -> None:
    store = Store(bucket_bounds(load_slos(None)))
    stage = Stage(name="c8", users=8, duration=180.0)
    assert progress_line(stage, 0.0, store, 0, 0.0) == (
        "loadgen: [c8 0s/180s] users=0 req/s=0.0 out_tok/s=0 ttft_p99=- itl_p50=- ok=0 failed=0 cpu=0%"
    )


def test_rates_over_the_stage_so_far_and_only_its_own_series() -> None:
    slos = load_slos(None)
    cls = slos.class_for_priority(0)
    store = Store(bucket_bounds(slos))
    ok = RequestRecord(ttft=0.05, e2e=0.09, output_tokens=5, itl=[(0.01, 4)])
    for _ in range(3):
        store.record(ok, ("warmup", cls.name, "m"), cls)
    store.record(RequestRecord(outcome="server_error", status=500), ("warmup", cls.name, "m"), cls)
    store.record(ok, ("c8", cls.name, "m"), cls)  # another stage: not in this line
    store.window_tokens["warmup"] += 40
    stage = Stage(name="warmup", warmup=True, users=4, until_requests=100)
    line = progress_line(stage, 2.0, store, 4, 0.083)
    ttft = store.series[("warmup", cls.name, "m")].dists["ttft"].quantile(0.99) * 1e3
    assert line == (
        f"loadgen: [warmup 2s until 100 req] users=4 req/s=2.0 out_tok/s=20 ttft_p99={ttft:.1f}ms "
        "itl_p50=10.00ms ok=3 failed=1 cpu=8%"
    )
