"""The training series' server counts what scrapes it: a run waits for a scrape before and after it
(``wait_for_scrape``), and only a ``/metrics`` response counts."""

from __future__ import annotations

import httpx

from exporters.training.metrics import TrainingMetrics, serve


def test_only_metrics_responses_count_as_scrapes_and_a_wait_without_one_times_out() -> None:
    metrics = TrainingMetrics()
    server = serve(metrics)
    try:
        assert server.scrapes == 0
        assert httpx.get(server.url + "/health").status_code == 200
        assert httpx.get(server.url + "/nope").status_code == 404
        assert server.scrapes == 0
        metrics.start_run("r", policy=False)
        body = httpx.get(server.url + "/metrics").text
        assert 'loadlens_training_step_total{run="r"} 0.0' in body
        assert server.scrapes == 1
        assert server.wait_for_scrape(0.05) is False  # nothing scrapes it meanwhile
        assert server.scrapes == 1
    finally:
        server.close()
