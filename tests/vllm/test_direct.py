"""The rig itself, against the real vLLM directly: the tiny model is served with its chat template, and the
official ``openai`` client streams a chat completion with the final usage chunk."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from loadlens.contracts.kv_capacity import parse_kv_capacity
from tests.support import required
from tests.support import vllm_server as rig
from tests.support.vllm_model import SERVED_NAME

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there, world!"}]


def prompt_tokens(model_path: str) -> int:
    """The chat prompt's length by the model's own tokenizer and template, as vLLM must count it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True)
    return len(ids["input_ids"])


def test_models_card_names_the_tiny_model(vllm_server: rig.VllmServer) -> None:
    with urllib.request.urlopen(vllm_server.url + "/v1/models", timeout=10) as resp:
        cards = json.load(resp)["data"]
    assert [(c["id"], c["owned_by"], c["max_model_len"], c["parent"]) for c in cards] == [
        (SERVED_NAME, "vllm", rig.MAX_MODEL_LEN, None)
    ]


def test_streamed_chat_with_usage_through_the_openai_client(vllm_server: rig.VllmServer) -> None:
    openai = required.require_module("openai")
    client = openai.OpenAI(base_url=vllm_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    chunks = list(
        client.chat.completions.create(
            model=SERVED_NAME,
            messages=MESSAGES,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    *with_choices, last = chunks
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in with_choices if c.choices[0].finish_reason] == ["length"]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (prompt_tokens(str(vllm_server.model.path)), 8)
    # A chunk per token, unless vLLM's API server fell behind its engine: then it merges the outputs
    # waiting for a request into one chunk (RequestOutputCollector), as happens on a loaded machine.
    assert 1 <= len(content) <= 8
    assert {c.id for c in chunks} == {chunks[0].id}


def test_the_kv_capacity_in_its_metrics_is_the_one_it_logs(vllm_server: rig.VllmServer) -> None:
    """``vllm:cache_config_info`` states the capacity the engine logged at start-up (the sampler and
    ``loadlens calibrate`` read it from there: loadlens/contracts/kv_capacity.py)."""
    with urllib.request.urlopen(vllm_server.url + "/metrics", timeout=10) as resp:
        capacity = parse_kv_capacity(resp.read().decode())
    logged = re.search(r"KV cache size: ([\d,]+) tokens", vllm_server.log_path.read_text(errors="replace"))
    assert logged is not None, "vLLM's log has no KV cache size line"
    assert capacity is not None and capacity.tokens == int(logged.group(1).replace(",", ""))
