"""Adapters written by ``loadlens lora make`` (no torch, no PEFT) for the rig's tiny model load into the real
vLLM and serve completions (issue 23, item 1; docs/lora.md): through ``POST /v1/load_lora_adapter`` into the
session's vLLM, and at start-up through ``--lora-modules NAME=PATH`` into a vLLM of their own.

A zero-B adapter changes nothing, so at temperature 0 its completion is the base model's token for token; a
random-B one (seeded) changes the logits, and its completion differs from the base model's."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
import pytest

from loadlens.cli import main
from loadlens.lora import make_adapter
from tests.support import vllm_server as rig
from tests.support.vllm_model import SERVED_NAME, tiny_model
from tests.vllm.conftest import require_vllm

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
    with (
        httpx.Client(base_url=vllm_server.url, timeout=120) as client,
        rig.adapters_unloaded(client, list(names.values())),
    ):
        for name in names.values():
            answer = client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(tmp_path / name)})
            assert answer.status_code == 200, answer.text
        listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert {listed[n]["root"] for n in names.values()} == {str(tmp_path / n) for n in names.values()}
        base = complete(client, vllm_server.served_name)
        assert complete(client, names["zero"]) == base
        assert complete(client, names["random"]) != base


ADDING = re.compile(r"\[" + re.escape(rig.LORA_LOG_LOGGER) + r" pid=\d+\] Adding lora\. Model id: \d+")
"""vLLM's line for an adapter read from storage into its cache (``rig.lora_logging_config`` turns it on)."""


@pytest.fixture(scope="module")
def vllm_interpreter() -> Path:
    """As the session's vLLM fixture does, outside any one test: importing torch sets process-wide variables
    (``TORCHINDUCTOR_CACHE_DIR``), which a test must not leave changed."""
    return require_vllm()


@pytest.mark.xdist_group("vllm")  # beside the session's vLLM, never alongside it on another worker
def test_made_adapter_loads_at_start_up(tmp_path: Path, vllm_interpreter: Path) -> None:
    """``--lora-modules made=PATH``: vLLM reads the adapter while it starts (its start-up fails on an adapter it
    cannot load), lists it and serves it. A vLLM of its own, because the session's starts before any test runs."""
    interpreter = vllm_interpreter
    model = tiny_model()
    adapter = tmp_path / "made"
    report = make_adapter(model.path, adapter, rank=16, target_modules=["q_proj", "v_proj", "down_proj"], seed=7,
                          base_name=SERVED_NAME)  # fmt: skip
    assert report.file_bytes == (adapter / "adapter_model.safetensors").stat().st_size
    log = tmp_path / "vllm.log"
    env = rig.lora_logging_config(tmp_path / "logging.json")
    argv = ("--lora-modules", f"made={adapter}")
    with rig.vllm_server(model, log_path=log, interpreter=interpreter, extra_args=argv, env=env) as server:
        assert len(ADDING.findall(log.read_text(errors="replace"))) == 1, server.log_tail()  # before any request
        with httpx.Client(base_url=server.url, timeout=120) as client:
            listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
            assert (listed["made"]["root"], listed["made"]["parent"]) == (str(adapter), SERVED_NAME)
            assert complete(client, "made") != complete(client, SERVED_NAME)
