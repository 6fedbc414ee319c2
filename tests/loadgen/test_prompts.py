"""Request bodies: exact traffic shares, determinism under a seed, token lengths, images, prefixes, ShareGPT."""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from exporters.serving.engines.sim.tokenizer import count_tokens
from exporters.serving.protocol import parse_request
from loadgen.profile import parse_profile
from loadgen.prompts import PromptFactory, SmoothWeightedRoundRobin, png_data_url


def profile(traffic: list[dict[str, Any]], base: Path | None = None) -> Any:
    return parse_profile(
        {"version": 1, "name": "t", "traffic": traffic, "stages": [{"name": "s", "users": 1, "duration": 1}]},
        base=base,
    )


def test_smooth_wrr_gives_exact_interleaved_shares() -> None:
    wrr = SmoothWeightedRoundRobin([85, 15])
    picks = [wrr.next() for _ in range(100)]
    assert picks.count(1) == 15
    assert max(len(run) for run in "".join(map(str, picks)).split("1")) <= 7  # spread out, not a block of 15


def test_same_seed_same_requests_other_seed_or_process_differs() -> None:
    p = profile([{"name": "a", "weight": 1, "prompt": {"tokens": {"mean": 50, "stdev": 20, "min": 5, "max": 100}}}])
    a = [PromptFactory(p, seed=1).next("m").body for _ in range(1)]
    first = PromptFactory(p, seed=1)
    second = PromptFactory(p, seed=1)
    assert [first.next("m").body for _ in range(5)] == [second.next("m").body for _ in range(5)]
    assert PromptFactory(p, seed=2).next("m").body != a[0]
    assert PromptFactory(p, seed=1, process_index=1).next("m").body != a[0]


def test_synthetic_prompt_lengths_and_body_fields() -> None:
    p = profile(
        [
            {
                "name": "a",
                "weight": 1,
                "priority": 5,
                "prompt": {"tokens": {"mean": 300}},
                "output_tokens": {"mean": 64},
            }
        ]
    )
    req = PromptFactory(p, seed=0).next("tiny")
    body = json.loads(req.body)
    assert req.path == "/v1/chat/completions" and req.model == "tiny" and req.max_tokens == 64
    assert body["stream"] is True and body["ignore_eos"] is True and body["priority"] == 5
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert count_tokens(body["messages"][0]["content"]) == 300  # one token per word in the sim tokenizer
    parse_request("chat", body)  # the serving layer accepts it


def test_images_are_valid_png_data_urls_and_prefixes_are_shared() -> None:
    url = png_data_url(64, 32, 3)
    png = base64.b64decode(url.split(",", 1)[1])
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    idat_len = int.from_bytes(png[33:37], "big")
    raw = zlib.decompress(png[41 : 41 + idat_len])
    assert len(raw) == 32 * (1 + 64 * 3)
    p = profile(
        [
            {
                "name": "v",
                "weight": 1,
                "images": {"count": 2, "width": 64, "height": 64},
                "prefix": {"count": 2, "tokens": 40},
            }
        ]
    )
    factory = PromptFactory(p, seed=0)
    bodies = [json.loads(factory.next("m").body) for _ in range(8)]
    systems = {b["messages"][0]["content"] for b in bodies}
    assert len(systems) == 2 and all(count_tokens(s) == 40 for s in systems)
    parts = bodies[0]["messages"][1]["content"]
    assert [x["type"] for x in parts] == ["image_url", "image_url", "text"]
    assert parse_request("chat", bodies[0]).image_count == 2


def test_completions_endpoint() -> None:
    p = profile([{"name": "c", "weight": 1, "endpoint": "completions", "prefix": {"count": 1, "tokens": 3}}])
    req = PromptFactory(p, seed=0).next("m")
    body = json.loads(req.body)
    assert req.path == "/v1/completions" and "\n" in body["prompt"]
    parse_request("completions", body)


def test_sharegpt_prompts_and_dataset_output_lengths(tmp_path: Path) -> None:
    convs = [
        {"conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": "x" * (40 * i)}]}
        for i in range(1, 6)
    ]
    convs.append({"conversations": [{"from": "gpt", "value": "orphan"}]})  # skipped: no human turn
    (tmp_path / "sg.json").write_text(json.dumps(convs))
    p = profile(
        [{"name": "s", "weight": 1, "prompt": {"source": "sharegpt", "path": "sg.json"}, "output_tokens": "dataset"}],
        base=tmp_path,
    )
    factory = PromptFactory(p, seed=0)
    reqs = [factory.next("m") for _ in range(5)]
    prompts = {json.loads(r.body)["messages"][0]["content"] for r in reqs}
    assert prompts == {f"question {i}" for i in range(1, 6)}
    assert sorted(r.max_tokens for r in reqs) == [10, 20, 30, 40, 50]


def test_bad_sharegpt_file(tmp_path: Path) -> None:
    (tmp_path / "sg.json").write_text("{}")
    p = profile([{"name": "s", "weight": 1, "prompt": {"source": "sharegpt", "path": "sg.json"}}], base=tmp_path)
    with pytest.raises(ValueError, match="top level must be a list"):
        PromptFactory(p, seed=0)
