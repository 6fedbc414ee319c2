"""Shared-prefix traffic: stated group shares (exact over every cycle), the client's expected prefix-cache hit
rate on hand-computed examples, the server's figure from Prometheus, and the sim agreeing with both."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadgen.metrics import bucket_bounds
from loadgen.profile import Profile, ProfileError, parse_profile
from loadgen.prompts import PromptFactory, share_weights
from loadgen.record import RequestRecord
from loadgen.serverside import figures_for_stages
from loadgen.workload import Workload, WorkloadStats, expected_hit_tokens, summary_lines, workload_block
from loadlens.contracts.slo import load_slos
from loadlens.util.child import http_child
from loadlens.util.net import free_port
from tests.loadgen.conftest import loadlens, result_of, run_child, write_profile
from tests.loadgen.test_serverside import fake_prometheus
from tests.support.paths import ROOT
from tests.support.server import serve_app

BOUNDS = bucket_bounds(load_slos(None))


def profile(traffic: list[dict[str, Any]], **top: Any) -> Profile:
    return parse_profile(
        {"version": 1, "name": "t", "traffic": traffic, "stages": [{"name": "s", "users": 1, "duration": 1}], **top}
    )


GROUPS = {"tokens": 48, "groups": [{"share": 0.5}, {"share": 0.3, "tokens": 32}]}


def system_prompt(body: bytes) -> str | None:
    messages = json.loads(body)["messages"]
    return messages[0]["content"] if messages[0]["role"] == "system" else None


def test_group_shares_are_exact_over_every_cycle_and_the_rest_has_no_prefix() -> None:
    assert share_weights((0.5, 0.3)) == [5.0, 3.0, 2.0]
    factory = PromptFactory(profile([{"name": "a", "prompt": {"tokens": 4}, "prefix": GROUPS}]), seed=1)
    reqs = [factory.next("m") for _ in range(1000)]
    for start in range(0, 1000, 10):  # every cycle of 10 requests: 5 of group 0, 3 of group 1, 2 without
        assert Counter(r.prefix_group for r in reqs[start : start + 10]) == {0: 5, 1: 3, None: 2}
    texts = {g: {system_prompt(r.body) for r in reqs if r.prefix_group == g} for g in (0, 1, None)}
    assert texts[None] == {None}
    assert len(texts[0]) == 1 and len(texts[1]) == 1  # one shared prompt per group
    assert [len(t.split()) for t in texts[0] | texts[1] if t] in ([48, 32], [32, 48])


def test_the_count_form_still_picks_one_of_count_prefixes_at_random() -> None:
    factory = PromptFactory(profile([{"name": "a", "prefix": {"count": 3, "tokens": 8}}]), seed=1)
    groups = Counter(factory.next("m").prefix_group for _ in range(300))
    assert set(groups) == {0, 1, 2} and all(60 < n < 140 for n in groups.values())


@pytest.mark.parametrize(
    ("shared", "prompt", "block", "hits"),
    [
        (256, 300, 16, 256),  # whole blocks of the shared prefix
        (250, 300, 16, 240),  # a partial block is never hit
        (300, 300, 16, 288),  # never the prompt's last token: floor(299 / 16) blocks
        (64, 64, 16, 48),
        (10, 300, 16, 0),
        (0, 300, 16, 0),
        (500, 1, 16, 0),
        (100, 300, 1, 100),
    ],
)
def test_expected_hits_of_one_request(shared: int, prompt: int, block: int, hits: int) -> None:
    assert expected_hit_tokens(shared, prompt, block) == hits


def test_expected_hit_rate_of_a_sequence_by_hand() -> None:
    """Group 0 (48 tokens) on half the requests, group 1 (32) on 3 in 10, none on 2 in 10; every prompt 100
    tokens. Requests 0..9 pick groups 0 1 - 0 0 1 0 - 1 0 (smooth round robin, '-' = none): the first of each
    group misses; then group 0 hits 48 (3 blocks of 16), group 1 hits 32."""
    p = profile([{"name": "a", "prompt": {"tokens": 4}, "prefix": GROUPS}])
    factory = PromptFactory(p, seed=1)
    w = Workload(p, factory, seed=1, process_index=0)
    stats = WorkloadStats(BOUNDS["ttft"])
    picks = []
    for _ in range(10):
        turn = w.next(owner=None, now=0.0, default_model="m", stage="s", stats=stats)
        picks.append(turn.request.prefix_group)
        w.finish(turn, RequestRecord(ttft=0.1, e2e=0.2, prompt_tokens=100), now=0.0, stage="s", stats=stats)
    assert picks == [0, 1, None, 0, 0, 1, 0, None, 1, 0]
    hits = 4 * 48 + 2 * 32  # group 0: 5 requests, 4 after the first; group 1: 3, 2 after the first
    block = workload_block(stats, ["s"], 16)
    assert block["expected_prefix_cache_hit_tokens"] == hits == 256
    assert block["prompt_tokens"] == 1000 and block["expected_prefix_cache_hit_ratio"] == 0.256


def test_a_prefix_is_shared_per_model_and_a_block_size_comes_from_the_profile() -> None:
    """A different adapter is a different cache (vLLM and the sim hash the adapter into each block)."""
    p = profile(
        [{"name": "a", "prefix": {"count": 1, "tokens": 40}, "adapters": {"x": 1, "y": 1}}], cache_block_size=32
    )
    w = Workload(p, PromptFactory(p, seed=1), seed=1, process_index=0)
    stats = WorkloadStats(BOUNDS["ttft"])
    shared = []
    for _ in range(4):
        turn = w.next(owner=None, now=0.0, default_model="m", stage="s", stats=stats)
        shared.append((turn.request.model, turn.shared))
        w.finish(turn, RequestRecord(ttft=0.1, e2e=0.2, prompt_tokens=90), now=0.0, stage="s", stats=stats)
    assert shared == [("x", 0), ("y", 0), ("x", 40), ("y", 40)]
    assert stats.stages["s"].expected_hit_tokens == 2 * 32  # 40 shared tokens are one whole block of 32


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ({"count": 2, "tokens": 8, "groups": [{"share": 0.5}]}, "traffic[0].prefix: set count"),
        ({"tokens": 8, "groups": [{"share": 0.7}, {"share": 0.4}]}, "traffic[0].prefix.groups: shares sum to 1.1"),
        ({"groups": [{"share": 0.5}]}, "traffic[0].prefix.groups[0].tokens: missing"),
        ({"tokens": 8, "groups": [{"share": 0}]}, "traffic[0].prefix.groups[0].share: must be > 0"),
        ({"tokens": 8, "groups": [{"share": 1.5}]}, "traffic[0].prefix.groups[0].share: must be in (0, 1]"),
        ({"tokens": 8, "groups": []}, "traffic[0].prefix.groups: must be a non-empty list"),
        ({"tokens": 8, "groups": [{"share": 0.5, "name": "x"}]}, "traffic[0].prefix.groups[0].name: unknown"),
    ],
)
def test_prefix_groups_are_validated_with_their_path(prefix: dict[str, Any], message: str) -> None:
    with pytest.raises(ProfileError) as err:
        profile([{"name": "a", "prefix": prefix}])
    assert str(err.value).startswith(message), str(err.value)
    with pytest.raises(ProfileError, match="^profile.cache_block_size: must be >= 1"):
        profile([{"name": "a"}], cache_block_size=0)


def test_the_server_hit_rate_comes_from_vllm_prefix_cache_counters() -> None:
    seen: list[dict[str, str]] = []
    answers = {
        "/ sum(increase(vllm:prefix_cache_queries_total": 0.625,
        "vllm:prefix_cache_hits_total": 500.0,
        "vllm:prefix_cache_queries_total": 800.0,
    }
    with serve_app(fake_prometheus(answers, seen)) as url:
        out = figures_for_stages(url, [("c8", 1000.0, 1060.0)])["c8"]
    assert (out["prefix_cache_hit_ratio"], out["prefix_cache_hit_tokens"], out["prefix_cache_query_tokens"]) == (
        0.625,
        500.0,
        800.0,
    )
    assert out["queries"]["prefix_cache_hit_ratio"] == (
        "sum(increase(vllm:prefix_cache_hits_total[60s])) / sum(increase(vllm:prefix_cache_queries_total[60s]))"
    )
    # vLLM before 0.12 also has the older names; they answer when the new ones are missing.
    with serve_app(fake_prometheus({"vllm:gpu_prefix_cache_hits_total": 7.0}, seen)) as url:
        old = figures_for_stages(url, [("c8", 1000.0, 1060.0)])["c8"]
    assert old["prefix_cache_hit_tokens"] == 7.0
    assert old["queries"]["prefix_cache_hit_tokens"] == "sum(increase(vllm:gpu_prefix_cache_hits_total[60s]))"
    lines = summary_lines(
        {"stages": [{"name": "c8", "workload": {"expected_prefix_cache_hit_ratio": 0.6}, "server": out}]}
    )
    assert lines[1] == "  c8: prefix cache hit rate: expected 60.0 %, server 62.5 %"


# --- on the sim ------------------------------------------------------------------------------------------------


@pytest.fixture
def sim_server() -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "loadlens.cli", "serve", "--engine", "sim", "--model-profile", "tiny"]
    cmd += ["--gpu-profile", "h100-sxm", "--port", str(port), "--log-level", "warning"]
    with http_child(cmd, port, cwd=ROOT) as url:
        yield url


def counter(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


@pytest.mark.slow
def test_the_sims_hit_rate_matches_the_designed_sharing(sim_server: str, tmp_path: Path) -> None:
    """Conversations (3 turns, one shared system prompt) and single requests (half with a 64-token prompt).

    Stated bound: exact. Prefixes are multiples of the sim's 16-token block and its chat template adds fewer
    than 16 tokens around them, every group is sent once by a single warmup user before concurrent users share
    it, each turn follows its previous one, and nothing is evicted (the tiny model's cache holds the run), so
    every block the expectation counts is a block the sim hits. The contexts grow by exactly the previous turn:
    its reply (8 tokens), the new user turn (24) and the sim's template around them (10: ``\\n<|user|>``,
    ``\\n<|assistant|>``)."""
    doc = {
        "stop_timeout_s": 30,  # the last requests finish (a cancelled one would count on the server only)
        "defaults": {"endpoint": "chat", "output_tokens": 8, "temperature": 0},
        "traffic": [
            {
                "name": "conv",
                "prompt": {"tokens": 24},
                "prefix": {"tokens": 128, "groups": [{"share": 1.0}]},
                "conversation": {"turns": 3, "think_time_s": 0.01},
            },
            {"name": "single", "prompt": {"tokens": 40}, "prefix": {"tokens": 64, "groups": [{"share": 0.5}]}},
        ],
        "stages": [
            {"name": "warmup", "warmup": True, "users": 1, "until_requests": 6},
            {"name": "c4", "users": 4, "until_requests": 40},
        ],
    }
    before = httpx.get(sim_server + "/metrics", timeout=5).text
    proc = run_child(
        loadlens(
            "--profile", str(write_profile(tmp_path / "p.yaml", doc)), "--host", sim_server, "--headless",
            "--results", str(tmp_path / "results"), "--metrics-port", "0", "--progress-interval", "0",
        ),
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    after = httpx.get(sim_server + "/metrics", timeout=5).text
    result = result_of(tmp_path / "results")
    stages = result["stages"]
    assert sum(s["failed"] + s["cancelled"] for s in stages) == 0
    hits = counter(after, "vllm:prefix_cache_hits_total") - counter(before, "vllm:prefix_cache_hits_total")
    queries = counter(after, "vllm:prefix_cache_queries_total") - counter(before, "vllm:prefix_cache_queries_total")
    expected = sum(s["workload"]["expected_prefix_cache_hit_tokens"] for s in stages)
    prompt = sum(s["workload"]["prompt_tokens"] for s in stages)
    assert queries == prompt == sum(s["total_input_tokens"] for s in stages)
    assert hits == expected, (hits, expected, queries)
    assert 0.3 < expected / prompt < 0.9  # the design shares a lot, but not everything
    turns = result["stages"][1]["workload"]["turns"]
    assert set(turns) == {"1", "2", "3"}
    p1, p2, p3 = (turns[k]["mean_prompt_tokens"] for k in ("1", "2", "3"))
    assert p2 - p1 == p3 - p2 == 8 + 24 + 10
    overall = result["overall"]["workload"]
    assert overall["conversations_started"] >= overall["conversations_completed"] > 0
    assert overall["conversations_ended_early"] == 0
    assert "prefix cache hit rate: expected" in proc.stdout
