"""Weighted adapter mixes: exact shares over every cycle, every model in the label sets and the results, and
on the sim with LoRA adapters loaded, the client's per-adapter counts equal to the server's."""

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

from loadgen.profile import Profile, ProfileError, parse_profile
from loadgen.prompts import PromptFactory, SmoothWeightedRoundRobin
from loadgen.results import traffic_workload
from loadgen.roles import LocalRole
from loadlens.util.child import http_child
from loadlens.util.net import free_port
from tests.loadgen.conftest import loadlens, result_of, run_child, write_profile
from tests.loadgen.test_roles import FakeRunner, environment
from tests.support.paths import ROOT

MIX = {"sql-lora": 70, "chat-lora": 20, "base": 10}


def profile(traffic: list[dict[str, Any]]) -> Profile:
    return parse_profile(
        {"version": 1, "name": "t", "traffic": traffic, "stages": [{"name": "s", "users": 1, "duration": 1}]}
    )


def test_adapter_shares_are_exact_over_every_cycle_and_base_is_the_runs_model() -> None:
    factory = PromptFactory(profile([{"name": "a", "prompt": {"tokens": 4}, "adapters": MIX}]), seed=1)
    models = [factory.next("tiny").model for _ in range(500)]
    for start in range(0, 500, 10):  # 70/20/10 has a cycle of 10 requests: 7, 2 and 1 of them
        assert Counter(models[start : start + 10]) == {"sql-lora": 7, "chat-lora": 2, "tiny": 1}
    bodies = PromptFactory(profile([{"name": "a", "adapters": MIX}]), seed=1)
    assert {json.loads(bodies.next("tiny").body)["model"] for _ in range(10)} == {"sql-lora", "chat-lora", "tiny"}


def test_base_means_the_entrys_model_when_it_names_one() -> None:
    p = profile([{"name": "a", "model": "big", "adapters": {"x": 1, "base": 1}}])
    factory = PromptFactory(p, seed=1)
    assert [factory.next("tiny").model for _ in range(4)] == ["x", "big", "x", "big"]
    assert p.traffic[0].models_for("tiny") == ("x", "big")
    assert p.models == ("big", "x")
    assert traffic_workload(p.traffic[0])["adapters"] == {"x": 0.5, "base": 0.5}


def test_every_adapter_is_a_model_label_from_the_start(tmp_path: Path) -> None:
    """``loadlens_client_*{model_name}`` are exported from the seeded series: each adapter has its own."""
    env = environment(tmp_path, FakeRunner())
    path = tmp_path / "mix.yaml"
    write_profile(
        path,
        {
            "traffic": [{"name": "a", "adapters": MIX}, {"name": "b", "model": "other"}],
            "stages": [{"name": "s", "users": 1, "duration": 1}],
        },
    )
    env.parsed_options.load_profile = str(path)
    role = LocalRole(env, report_interval=3.0, locust_version="9.9")
    role._seed_series()
    assert {key[2] for key in role.store.series} == {"sql-lora", "chat-lora", "m", "other"}


@pytest.mark.parametrize(
    ("adapters", "message"),
    [
        ({}, "traffic[0].adapters: must name at least one model"),
        ({"x": 0}, "traffic[0].adapters.x: must be > 0"),
        ({"x": "lots"}, "traffic[0].adapters.x: must be a number"),
        (["x", "y"], "traffic[0].adapters: must be a mapping"),
    ],
)
def test_adapters_are_validated_with_their_path(adapters: Any, message: str) -> None:
    with pytest.raises(ProfileError) as err:
        profile([{"name": "a", "adapters": adapters}])
    assert str(err.value).startswith(message), str(err.value)


# --- on the sim, with two LoRA adapters loaded -----------------------------------------------------------------

ADMIN = {"Authorization": "Bearer t"}


@pytest.fixture
def sim_with_adapters(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "adapters"
    for name in ("sql-lora", "chat-lora"):
        (root / name).mkdir(parents=True)
        (root / name / "adapter_config.json").write_text(
            json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]})
        )
    port = free_port()
    cmd = [sys.executable, "-m", "loadlens.cli", "serve", "--engine", "sim", "--model-profile", "tiny"]
    cmd += ["--gpu-profile", "h100-sxm", "--port", str(port), "--log-level", "warning", "--knob", "max_loras=2"]
    cmd += ["--lora-root", str(root), "--admin-token", "t"]
    with http_child(cmd, port, cwd=ROOT) as url:
        for name in ("sql-lora", "chat-lora"):
            r = httpx.post(url + "/v1/load_lora_adapter", headers=ADMIN, json={"lora_name": name, "lora_path": name})
            assert r.status_code == 200, r.text
        yield url


def served_ok(metrics: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in re.findall(r"^loadlens_requests_total\{([^}]*)\} (\S+)$", metrics, re.M):
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if fields.get("code") == "200" and float(value):
            out[fields["model_name"]] = out.get(fields["model_name"], 0.0) + float(value)
    return out


@pytest.mark.slow
def test_a_70_20_10_mix_on_the_sim_gives_exact_shares_per_adapter(sim_with_adapters: str, tmp_path: Path) -> None:
    doc = {
        "defaults": {"endpoint": "chat", "output_tokens": 6, "prompt": {"tokens": 16}},
        "traffic": [{"name": "mix", "adapters": MIX}],
        "stop_timeout_s": 30,
        "stages": [{"name": "c4", "users": 4, "until_requests": 60}],
    }
    proc = run_child(
        loadlens(
            "--profile", str(write_profile(tmp_path / "p.yaml", doc)), "--host", sim_with_adapters, "--headless",
            "--results", str(tmp_path / "results"), "--metrics-port", "0", "--progress-interval", "0",
        ),
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    result = result_of(tmp_path / "results")
    stage = result["stages"][0]
    assert stage["completed"] >= 60 and stage["failed"] == 0
    # The requests sent (completed, or cancelled when the run stopped their user) are the round robin's picks,
    # whatever user sent each: the first n, less any pick whose request was never recorded because the run
    # stopped its user between the pick and the record (at most one per user; a loaded machine once lost one:
    # 362/104/52 of 363/103/52). So they are the first n + k picks less k of them, k <= users.
    users = doc["stages"][0]["users"]
    sent = {m: s["completed"] + s["failed"] + s["cancelled"] for m, s in stage["models"].items()}
    n = sum(sent.values())
    wrr = SmoothWeightedRoundRobin([70.0, 20.0, 10.0])
    names = ("sql-lora", "chat-lora", "tiny")
    picks = [names[wrr.next()] for _ in range(n + users)]
    lost = next((k for k in range(users + 1) if all(Counter(picks[: n + k])[m] >= sent[m] for m in names)), None)
    assert lost is not None, (sent, Counter(picks[:n]))
    assert all(abs(sent[m] - n * w / 100) < 1 + lost for m, w in zip(names, (70, 20, 10), strict=True))
    # Every figure exists per adapter: latencies, tokens, goodput.
    per_model = {m: s["completed"] for m, s in stage["models"].items()}
    for m in names:
        figures = stage["models"][m]
        assert figures["ttft_samples"] == per_model[m] and figures["total_output_tokens"] == 6 * per_model[m]
        assert figures["p99_ttft_ms"] is not None and figures["goodput_requests"] is not None
    # The server counted the same successful requests per adapter (a cancelled one it may have finished).
    served = served_ok(httpx.get(sim_with_adapters + "/metrics", timeout=5).text)
    assert all(per_model[m] <= served.get(m, 0) <= sent[m] for m in names), (served, per_model, sent)
    if stage["cancelled"] == 0:
        assert served == {m: float(c) for m, c in per_model.items()}
    assert result["profile"]["traffic"][0]["adapters"] == {"sql-lora": 0.7, "chat-lora": 0.2, "base": 0.1}
