"""The HTTP layer over the real simulated engine: what a client of `loadlens serve --engine sim` sees."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.serving.app import ServeSettings, create_app
from exporters.serving.engines.sim import SimEngine, load_gpu_profile, load_model_profile
from exporters.serving.tracing import Tracing
from loadlens.contracts.device_state import DEVICE_STATE_VERSION, DeviceState
from tests.support import required
from tests.support.server import raw_stream, serve_app

ADMIN = {"Authorization": "Bearer t"}


@dataclass
class Sim:
    url: str
    registry: CollectorRegistry
    lora_root: Path

    def sample(self, name: str, labels: dict[str, str]) -> float | None:
        return self.registry.get_sample_value(name, labels)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Sim]:
    registry = CollectorRegistry()
    engine = SimEngine(
        load_model_profile("deepseek-r1-distill-llama-8b"),
        load_gpu_profile("h100-sxm"),
        registry=registry,
        speed=2.0,
        served_model_name="tiny",  # a short name for the tests; the model is Llama-8B-shaped
        knobs={"scheduling_policy": "priority", "max_waiting": 4, "max_loras": 1},
    )
    root = tmp_path / "adapters"
    (root / "sql").mkdir(parents=True)
    (root / "sql" / "adapter_config.json").write_text(
        json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]})
    )
    app = create_app(
        engine, ServeSettings(admin_token="t", lora_root=root), registry=registry, tracing=Tracing.disabled()
    )
    with serve_app(app) as url:
        yield Sim(url, registry, root)


def test_openai_client_against_the_sim(sim: Sim) -> None:
    openai = required.require_module("openai")
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="x")
    done = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert done.choices[0].finish_reason == "length"
    assert done.usage is not None and done.usage.completion_tokens == 8
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == done.choices[0].message.content  # temperature 0: same prompt, same text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


def test_chat_without_max_tokens_generates_until_a_natural_stop(sim: Sim) -> None:
    r = httpx.post(
        sim.url + "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in {"stop", "length"}


def test_context_overflow_and_fcfs_priority_are_400(sim: Sim) -> None:
    r = httpx.post(sim.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 10**7})
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("This model's maximum context length is")
    assert r.json()["error"]["param"] == "prompt"


def test_disconnect_frees_the_slot_and_kv_blocks(sim: Sim) -> None:
    body = {"model": "tiny", "prompt": "a " * 200, "max_tokens": 1500, "ignore_eos": True, "stream": True}
    labels = {"model_name": "tiny", "engine": "0"}
    with raw_stream(sim.url, "/v1/completions", body, until=b"data: ", count=3):
        assert sim.sample("vllm:num_requests_running", labels) == 1
        assert (sim.sample("vllm:kv_cache_usage_perc", labels) or 0) > 0
    deadline = time.monotonic() + 30
    while sim.sample("vllm:num_requests_running", labels) != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sim.sample("vllm:num_requests_running", labels) == 0
    assert sim.sample("vllm:kv_cache_usage_perc", labels) == 0
    assert sim.sample("vllm:request_success_total", {**labels, "finished_reason": "abort"}) == 1
    assert sim.sample("loadlens_request_aborts_total", {"model_name": "tiny", "reason": "client_disconnect"}) == 1


def test_queue_full_is_429(sim: Sim) -> None:
    assert httpx.patch(sim.url + "/admin/knobs", headers=ADMIN, json={"max_num_seqs": 1}).status_code == 200
    body = {"model": "tiny", "prompt": "x", "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        streams = [client.stream("POST", "/v1/completions", json=body) for _ in range(5)]
        responses = [s.__enter__() for s in streams]  # 1 running + 4 waiting fills max_waiting=4
        try:
            assert [r.status_code for r in responses] == [200] * 5
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 429
            assert int(r.headers["retry-after"]) >= 1
        finally:
            for s in streams:
                s.__exit__(None, None, None)
    assert sim.sample("vllm:admission_rejections_total", {"model_name": "tiny", "reason": "max_num_queued_reqs"}) == 1


def test_lora_adapter_load_serve_and_unload(sim: Sim) -> None:
    r = httpx.post(sim.url + "/v1/load_lora_adapter", headers=ADMIN, json={"lora_name": "sql", "lora_path": "sql"})
    assert r.status_code == 200, r.text
    models = httpx.get(sim.url + "/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["tiny", "sql"]
    r = httpx.post(
        sim.url + "/v1/completions", json={"model": "sql", "prompt": "x", "max_tokens": 4, "ignore_eos": True}
    )
    assert r.status_code == 200
    assert r.json()["model"] == "sql"
    missing = httpx.post(
        sim.url + "/v1/load_lora_adapter", headers=ADMIN, json={"lora_name": "nope", "lora_path": "missing-dir"}
    )
    assert missing.status_code == 400
    assert httpx.post(sim.url + "/v1/unload_lora_adapter", headers=ADMIN, json={"lora_name": "sql"}).status_code == 200
    assert httpx.post(sim.url + "/v1/completions", json={"model": "sql", "prompt": "x"}).status_code == 404


def test_device_state_document_validates(sim: Sim) -> None:
    httpx.post(sim.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 16, "ignore_eos": True})
    doc = httpx.get(sim.url + "/sim/device-state").json()
    state = DeviceState.model_validate(doc)
    assert state.version == DEVICE_STATE_VERSION
    assert len(state.devices) == 1
    device = state.devices[0]
    owners = device.memory_by_owner
    assert sum(owners.model_dump().values()) == device.memory_used_bytes
    assert device.util_samples, "a request ran: there must be utilisation samples"
    newest = device.util_samples[-1].timestamp_us
    later = DeviceState.model_validate(httpx.get(sim.url + f"/sim/device-state?since_us={newest}").json())
    assert all(s.timestamp_us > newest for s in later.devices[0].util_samples)


def test_responses_api_whole_and_streamed(sim: Sim) -> None:
    openai = required.require_module("openai")
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="x")
    whole = client.responses.create(
        model="tiny", input="Say hello", instructions="be brief", max_output_tokens=4, extra_body={"ignore_eos": True}
    )
    assert whole.status == "incomplete"
    assert whole.incomplete_details is not None and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage is not None and whole.usage.output_tokens == 4
    assert len(whole.output_text.split()) == 4
    with client.responses.stream(model="tiny", input=[{"role": "user", "content": "hi"}], max_output_tokens=3) as s:
        kinds = [ev.type for ev in s]
        final = s.get_final_response()
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    deltas = kinds.count("response.output_text.delta")
    assert 1 <= deltas <= 3
    assert kinds[4 + deltas :] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.usage is not None and final.usage.output_tokens == deltas
    labels = {"model_name": "tiny", "priority_class": "interactive", "code": "200"}
    assert sim.sample("loadlens_requests_total", labels) == 2


def test_responses_api_refusals(sim: Sim) -> None:
    for body, param in (
        ({"input": []}, "input"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "x", "background": True}, "background"),
        ({"input": [{"role": "wizard", "content": "x"}]}, "input"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ):
        r = httpx.post(sim.url + "/v1/responses", json=body)
        assert r.status_code == 400, body
        assert r.json()["error"]["param"] == param
