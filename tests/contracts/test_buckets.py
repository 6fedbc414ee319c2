from __future__ import annotations

import pytest

from loadlens.contracts import buckets
from loadlens.contracts.slo import load_slos


def test_1_2_5_buckets() -> None:
    assert buckets.build_1_2_5_buckets(1) == [1]
    assert buckets.build_1_2_5_buckets(4096) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    with pytest.raises(ValueError):
        buckets.build_1_2_5_buckets(0)


def test_vllm_families_match_upstream_lengths_and_ends() -> None:
    # vLLM 0.33 (vllm/v1/metrics/buckets.py): these exact sets are what its dashboards expect.
    assert len(buckets.VLLM_TIME_TO_FIRST_TOKEN) == 22 and buckets.VLLM_TIME_TO_FIRST_TOKEN[-1] == 2560.0
    assert len(buckets.VLLM_INTER_TOKEN_LATENCY) == 19 and buckets.VLLM_INTER_TOKEN_LATENCY[0] == 0.01
    assert len(buckets.VLLM_REQUEST_LATENCY) == 21 and buckets.VLLM_REQUEST_LATENCY[-1] == 7680.0
    assert buckets.VLLM_ITERATION_TOKENS == (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def test_every_family_is_strictly_increasing() -> None:
    for name in dir(buckets):
        value = getattr(buckets, name)
        if name.isupper() and isinstance(value, tuple):
            assert all(a < b for a, b in zip(value, value[1:], strict=False)), name


def test_slo_thresholds_become_boundaries() -> None:
    slos = load_slos()
    ttft = buckets.with_boundaries(buckets.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, slos.all_thresholds("ttft"))
    assert 0.2 in ttft and 2.5 in ttft
    assert list(ttft) == sorted(set(ttft))
    with pytest.raises(ValueError):
        buckets.with_boundaries((0.1,), (0.0,))
