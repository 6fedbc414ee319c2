"""Where a real percentile falls in the sim's samples (exporters/serving/calibrate/ranks.py)."""

from __future__ import annotations

import pytest

from exporters.serving.calibrate.ranks import Rank, percentile_ranks, rank_of


def test_rank_counts_the_samples_at_or_below_ties_half() -> None:
    ordered = [1.0, 2.0, 2.0, 3.0]
    assert rank_of(0.5, ordered) == 0.0
    assert rank_of(2.0, ordered) == 0.5  # one below, two equal
    assert rank_of(2.5, ordered) == 0.75
    assert rank_of(9.0, ordered) == 1.0


def test_a_bimodal_median_is_a_knife_edge_the_rank_shows() -> None:
    """Two modes of nearly equal weight: the sim's median is its upper mode's 250 ms, and a real median of 240 ms
    is 4 % off it yet below every sample of that mode. The rank, 0.49, says the real median is where the sim's
    distribution puts it, one point off. A real median of 100 ms, 60 % off, sits inside the lower mode (rank
    0.245, its ties counting half): the value error says as much about the edge as about the model."""
    sim = [100.0] * 49 + [250.0] * 51
    real = {"median_ttft_ms": 240.0, "p99_ttft_ms": 260.0, "median_itl_ms": None}
    ranks = percentile_ranks(real, {"ttft": sim, "itl": [1.0]})
    assert set(ranks) == {"median_ttft_ms", "p99_ttft_ms"}  # no real ITL median, no E2E samples
    assert ranks["median_ttft_ms"] == Rank(0.5, 0.49, 100)
    assert ranks["median_ttft_ms"].shift_pp == pytest.approx(-1.0)
    assert percentile_ranks({"median_ttft_ms": 100.0}, {"ttft": sim})["median_ttft_ms"].rank == 0.245
    assert ranks["p99_ttft_ms"].rank == 1.0 and ranks["p99_ttft_ms"].as_dict() == {
        "quantile": 0.99, "rank": 1.0, "shift_pp": pytest.approx(1.0), "samples": 100}  # fmt: skip
