"""Adapters written by ``loadlens lora make`` (no torch, no PEFT) for the rig's tiny model load into the real
vLLM through ``POST /v1/load_lora_adapter`` and serve completions (issue 23, item 1; docs/lora.md).

A zero-B adapter changes nothing, so at temperature 0 its completion is the base model's token for token; a
random-B one (seeded) changes the logits, and its completion differs from the base model's."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from loadlens.cli import main
from tests.support import vllm_server as rig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

PROMPT = "Load tests measure"


def complete(client: httpx.Client, model: str) -> list[str]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "logprobs": 0}  # fmt: skip
    answer = client.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert answer.json()["model"] == model
    tokens: list[str] = choice["logprobs"]["tokens"]
    assert len(tokens) == 12
    return tokens


def test_made_adapters_load_and_serve(vllm_server: rig.VllmServer, tmp_path: Path) -> None:
    tag = f"made{os.getpid()}"
    names = {init: f"{tag}-{init}" for init in ("random", "zero")}
    for init, name in names.items():
        argv = ["lora", "make", str(vllm_server.model.path), "--out", str(tmp_path / name), "--rank", "16",
                "--target-modules", "q_proj,k_proj,v_proj,o_proj,down_proj", "--init-b", init, "--seed", "11",
                "--base-name", vllm_server.served_name]  # fmt: skip
        assert main(argv) == 0
    with httpx.Client(base_url=vllm_server.url, timeout=120) as client, rig.adapters_unloaded(client, names.values()):
        for name in names.values():
            answer = client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(tmp_path / name)})
            assert answer.status_code == 200, answer.text
        listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert {listed[n]["root"] for n in names.values()} == {str(tmp_path / n) for n in names.values()}
        base = complete(client, vllm_server.served_name)
        assert complete(client, names["zero"]) == base
        assert complete(client, names["random"]) != base
