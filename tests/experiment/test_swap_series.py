"""The hot-swap figures the /metrics sampler reads (loadlens/experiment/swap_series.py), from the serving
layer's own registry (exporters/serving/metrics.py) fed known per-request blocking times: increases over the
measured window only, the mean exact from ``_sum``/``_count``, the count above the SLO's 200 ms exact at the
histogram's edge, the P99 interpolated inside its bucket as ``histogram_quantile`` does; and the swap
schedule's validation in the experiment file."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporters.serving.metrics import ServingMetrics
from loadlens.contracts.buckets import LORA_SWAP_BLOCKING
from loadlens.contracts.slo import load_slos
from loadlens.experiment.models import ExperimentError, expand_trials, parse_experiment
from loadlens.experiment.swap_series import count_above, parse_swap_series, quantile, swap_figures, swap_values


def test_the_packaged_delay_is_a_bucket_edge() -> None:
    """So the count of requests blocked longer than it is exact (the serving layer adds the SLO file's
    threshold to the buckets anyway; the packaged one needs nothing added)."""
    assert load_slos().lora_swap.delay_seconds == 0.2
    assert 0.2 in LORA_SWAP_BLOCKING


def observe(metrics: ServingMetrics, model: str, blocked: list[float], unblocked: int) -> None:
    """As exporters/serving/lifecycle.py does for successful requests."""
    s = metrics.series("chat", model, "interactive")
    for seconds in [*blocked, *[0.0] * unblocked]:
        if seconds > 0:
            s.lora_blocking.observe(seconds)
            if seconds > metrics.slos.lora_swap.delay_seconds:
                s.lora_delayed.inc()
        s.finished.inc()


def scrape(registry: CollectorRegistry) -> dict[Any, float]:
    return parse_swap_series(generate_latest(registry).decode())


def test_increases_over_the_window_from_the_serving_layers_series() -> None:
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry, load_slos(), "sim", "test")
    observe(metrics, "lora-a", [1.0], 3)  # before the window: not counted
    samples = [(1.0, scrape(registry))]
    observe(metrics, "lora-a", [0.05], 1)
    samples.append((2.0, scrape(registry)))  # the window's first sample
    observe(metrics, "lora-a", [0.15, 0.25, 0.3], 5)
    observe(metrics, "lora-b", [0.01, 0.5], 3)
    samples.append((3.0, scrape(registry)))
    observe(metrics, "lora-b", [2.0], 0)  # after the window
    samples.append((4.0, scrape(registry)))

    fig = swap_figures(samples, [(1.5, 3.5)], 0.2)
    assert fig is not None
    assert fig.requests == 13 and fig.blocked_requests == 5 and fig.delayed_requests == 3
    assert fig.delayed_counter == 3 and fig.delay_exact is True
    assert fig.mean_blocked_ms == pytest.approx(1000 * (0.15 + 0.25 + 0.3 + 0.01 + 0.5) / 5)
    assert fig.blocked_ratio == pytest.approx(5 / 13) and fig.delayed_ratio == pytest.approx(3 / 13)
    # rank 0.99 * 5 = 4.95 lies in (0.4, 0.5], which holds the 5th observation: 400 + 100 * 0.95 ms
    assert fig.p99_blocked_ms == pytest.approx(495.0)
    a, b = fig.models["lora-a"], fig.models["lora-b"]
    assert (a.requests, a.blocked_requests, a.delayed_requests) == (8, 3, 2)
    assert a.mean_blocked_ms == pytest.approx(1000 * 0.7 / 3)
    assert (b.requests, b.blocked_requests, b.delayed_requests, b.delayed_counter) == (5, 2, 1, 1)
    # the proxy's and the sim's own swap series are not in this registry: absent, not 0
    assert fig.sim_adapter_loads is None and fig.probe_swap_windows is None and fig.vllm_adapter_loads == {}
    assert fig.adapter_load_calls == 0 and fig.swaps == 0 and fig.swaps_source == "adapter_load_calls"
    flat = swap_values(fig)
    assert flat["swap.delayed_requests"] == 3 and flat["swap.models.lora-b.requests"] == 5


def test_two_measured_stages_add_their_own_increases() -> None:
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry, load_slos(), "sim", "test")
    samples = [(1.0, scrape(registry))]
    observe(metrics, "m", [0.3], 0)
    samples.append((2.0, scrape(registry)))
    observe(metrics, "m", [0.3, 0.3], 0)  # between the stages: not counted
    samples.append((3.0, scrape(registry)))
    observe(metrics, "m", [0.1], 1)
    samples.append((4.0, scrape(registry)))
    fig = swap_figures(samples, [(0.5, 2.5), (2.8, 4.5)], 0.2)
    assert fig is not None and (fig.requests, fig.blocked_requests, fig.delayed_requests) == (3, 2, 1)


def test_a_delay_between_edges_is_interpolated_and_said_so() -> None:
    buckets = [(0.1, 2.0), (0.3, 6.0), (float("inf"), 8.0)]
    assert count_above(0.3, buckets) == (2.0, True)
    assert count_above(0.2, buckets) == (4.0, False)  # half of the 4 in (0.1, 0.3] assumed above 0.2
    assert count_above(5.0, buckets) == (2.0, False)  # the +Inf bucket: every one above the last edge
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry, load_slos(), "sim", "test")
    samples = [(1.0, scrape(registry))]
    observe(metrics, "m", [0.21], 0)
    samples.append((2.0, scrape(registry)))
    fig = swap_figures(samples, [(0.0, 3.0)], 0.22)
    assert fig is not None and fig.delay_exact is False


def test_quantile_as_histogram_quantile() -> None:
    assert quantile(0.5, [(0.1, 0.0), (0.2, 4.0), (float("inf"), 4.0)]) == pytest.approx(0.15)
    assert quantile(0.99, [(0.1, 1.0), (float("inf"), 10.0)]) == 0.1  # in +Inf: the highest finite edge
    assert quantile(0.99, [(0.1, 0.0), (float("inf"), 0.0)]) is None


def test_labels_with_quotes_braces_and_commas() -> None:
    text = (
        "# TYPE loadlens_slo_eligible_requests_total counter\n"
        'loadlens_slo_eligible_requests_total{model_name="a\\"},b",priority_class="x y"} 3.0\n'
        'loadlens_proxy_probe_swap_windows_total{on_demand="true"} 2.0 1700000000000\n'
        'vllm:num_requests_running{model_name="m"} 4\n'
    )
    assert parse_swap_series(text) == {
        ("loadlens_slo_eligible_requests_total", (("model_name", 'a"},b'), ("priority_class", "x y"))): 3.0,
        ("loadlens_proxy_probe_swap_windows_total", (("on_demand", "true"),)): 2.0,
    }


def test_a_server_without_the_series_gives_none() -> None:
    samples = [(1.0, parse_swap_series('vllm:num_requests_running{model_name="m"} 4\n'))] * 2
    assert swap_figures(samples, [(0.0, 2.0)], 0.2) is None


def vllm_load_time(loads: int, activations: int) -> dict[Any, float]:
    """vLLM's proposed ``vllm:lora_adapter_load_seconds{transition}`` (an open pull request): 40 ms per load,
    2 ms per activation."""
    lines = []
    for transition, count, each in (("load", loads, 0.04), ("activate", activations, 0.002)):
        lines.append(f'vllm:lora_adapter_load_seconds_count{{model_name="m",transition="{transition}"}} {count}')
        lines.append(f'vllm:lora_adapter_load_seconds_sum{{model_name="m",transition="{transition}"}} {count * each}')
    return parse_swap_series("\n".join(lines) + "\n")


def test_vllms_proposed_load_time_is_read_where_exported() -> None:
    """A vLLM read directly: its load times, and no request figures (its /metrics has no serving layer)."""
    fig = swap_figures([(1.0, vllm_load_time(1, 2)), (2.0, vllm_load_time(3, 12))], [(0.0, 3.0)], 0.2)
    assert fig is not None
    assert fig.vllm_adapter_loads == {"activate": 10, "load": 2}
    assert fig.vllm_adapter_load_mean_ms == pytest.approx({"activate": 2.0, "load": 40.0})
    assert fig.swaps == 12 and fig.swaps_source == "vllm_adapter_loads"
    assert fig.requests is None and fig.blocked_requests is None and fig.delayed_ratio is None
    assert fig.delay_seconds is None and fig.models == {}


EXPERIMENT: dict[str, Any] = {
    "version": 1,
    "name": "x",
    "parameters": {"every": 1.5},
    "adapters": [{"name": "a"}, {"name": "s"}],
    "profiles": {"p": {"version": 1, "name": "p", "traffic": [{"name": "t"}], "stages": [{"name": "s", "users": 1}]}},
    "trials": [{"name": "t", "profile": "p", "adapters": ["a"], "swaps": {"every": "${every}", "adapters": ["s"]}}],
    "analysis": {"kind": "hot_swap"},
}


def with_swaps(**swaps: Any) -> dict[str, Any]:
    doc = copy.deepcopy(EXPERIMENT)
    doc["trials"][0]["swaps"].update(swaps)
    return doc


def test_a_swap_schedule_is_planned_with_its_parameter() -> None:
    (trial,) = expand_trials(parse_experiment(EXPERIMENT, Path("x.yaml")))
    assert trial.swaps is not None and (trial.swaps.every, trial.swaps.adapters) == (1.5, ("s",))


@pytest.mark.parametrize(
    ("swaps", "message"),
    [
        (
            {"adapters": ["zz"]},
            "x.yaml: trials.0.swaps.adapters: no adapter 'zz' (the experiment's adapters: ['a', 's'])",
        ),
        ({"adapters": ["a"]}, "x.yaml: trials.0.swaps.adapters: 'a' is a trial adapter, loaded for the whole run"),
        ({"every": "${nope}"}, "x.yaml: trials.0.swaps.every: '${nope}' must be (or name) a number of seconds > 0"),
        ({"every": 0}, "x.yaml: trials.0.swaps.every: 0.0 must be (or name) a number of seconds > 0"),
    ],
)
def test_a_bad_swap_schedule_is_refused(swaps: dict[str, Any], message: str) -> None:
    with pytest.raises(ExperimentError) as err:
        parse_experiment(with_swaps(**swaps), Path("x.yaml"))
    assert str(err.value) == message
