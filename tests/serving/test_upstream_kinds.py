"""Upstream kinds in the proxy: detection (``--upstream-kind auto``), each kind's adapter endpoints or a 501,
and its context-length source, against fake upstreams that answer each kind's endpoints in their real shapes
(docs/serving.md, *Upstream kinds*)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.serving.app import ServeSettings, create_app
from exporters.serving.engines.openai import upstream_kinds
from exporters.serving.engines.openai.engine import OpenAIProxyEngine
from exporters.serving.tracing import Tracing
from tests.fixtures.upstream_streams import ReplayUpstream
from tests.support.server import free_port, serve_app

M = "meta-llama/Llama-3.1-8B-Instruct"

VLLM: dict[str, Any] = {
    "/v1/models": {
        "object": "list",
        "data": [
            {
                "id": M,
                "object": "model",
                "created": 1767225600,
                "owned_by": "vllm",
                "root": M,
                "parent": None,
                "max_model_len": 8192,
                "permission": [{"id": "modelperm-1", "object": "model_permission", "allow_sampling": True}],
            }
        ],
    },
    "/v1/load_lora_adapter": "Success: LoRA adapter 'sql' added successfully.",
    "/v1/unload_lora_adapter": "Success: LoRA adapter 'sql' removed successfully.",
}
# sglang before max_model_len was on its model card: the context comes from /get_server_info.
SGLANG: dict[str, Any] = {
    "/v1/models": {
        "object": "list",
        "data": [{"id": M, "object": "model", "created": 1767225600, "owned_by": "sglang", "root": M, "parent": None}],
    },
    "/get_model_info": {"model_path": M, "tokenizer_path": M, "is_generation": True},
    "/get_server_info": {"model_path": M, "tokenizer_path": M, "context_length": 32768, "version": "0.4.6"},
    "/load_lora_adapter": {"success": True, "error_message": "", "loaded_adapters": {"sql": "/loras/sql"}},
    "/unload_lora_adapter": {"success": True, "error_message": "", "loaded_adapters": {}},
}
LLAMACPP: dict[str, Any] = {
    "/v1/models": {
        "models": [{"name": "m.gguf", "model": "m.gguf", "type": "model", "capabilities": ["completion"]}],
        "object": "list",
        "data": [
            {
                "id": "m.gguf",
                "object": "model",
                "created": 1767225600,
                "owned_by": "llamacpp",
                "meta": {"vocab_type": 2, "n_vocab": 128256, "n_ctx_train": 131072, "n_embd": 4096},
            }
        ],
    },
    "/props": {
        "default_generation_settings": {"params": {"n_predict": -1, "temperature": 0.8}, "n_ctx": 4096},
        "total_slots": 4,
        "model_path": "/models/m.gguf",
        "modalities": {"vision": False, "audio": False},
        "build_info": "b7280-6a1f3c2d",
    },
    "/lora-adapters": [],
}
TGI: dict[str, Any] = {
    "/v1/models": {"object": "list", "data": [{"id": M, "object": "model", "created": 0, "owned_by": M}]},
    "/info": {
        "model_id": M,
        "model_sha": None,
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": 128,
        "max_best_of": 2,
        "max_stop_sequences": 4,
        "max_input_tokens": 4095,
        "max_total_tokens": 4096,
        "validation_workers": 2,
        "max_client_batch_size": 4,
        "router": "text-generation-router",
        "version": "3.3.6-dev0",
        "sha": None,
        "docker_label": None,
    },
}
GENERIC: dict[str, Any] = {
    "/v1/models": {"object": "list", "data": [{"id": M, "object": "model", "created": 1, "owned_by": "openai"}]}
}


@contextmanager
def proxy(documents: dict[str, Any], lora_root: Path, kind: str = "auto") -> Iterator[tuple[str, Any, Any]]:
    registry = CollectorRegistry()
    with ReplayUpstream(documents=documents) as upstream:
        engine = OpenAIProxyEngine(upstream.url, registry=registry, upstream_kind=kind)
        app = create_app(engine, ServeSettings(lora_root=lora_root), registry=registry, tracing=Tracing.disabled())
        with serve_app(app) as url:
            yield url, engine, upstream


def _paths(upstream: ReplayUpstream) -> list[str]:
    return [f"{s.method} {s.path}" for s in upstream.seen]


def _kind_series(engine: OpenAIProxyEngine) -> list[tuple[str, float]]:
    """``loadlens_proxy_upstream_info`` as (upstream_kind, value) pairs."""
    return [(s.labels["upstream_kind"], s.value) for m in engine.metrics.upstream_info.collect() for s in m.samples]


def _posts(upstream: ReplayUpstream) -> list[tuple[str, Any]]:
    return [(s.path, s.body) for s in upstream.seen if s.method == "POST"]


@pytest.mark.parametrize(
    ("documents", "kind", "context", "probes"),
    [
        (VLLM, "vllm", 8192, ["GET /v1/models"]),
        (SGLANG, "sglang", 32768, ["GET /v1/models", "GET /get_server_info"]),
        (LLAMACPP, "llamacpp", 4096, ["GET /v1/models", "GET /props"]),
        (TGI, "tgi", 4096, ["GET /v1/models", "GET /info"]),
        (GENERIC, "openai", None, ["GET /v1/models"]),  # nothing else is asked of a server it does not know
    ],
    ids=["vllm", "sglang", "llamacpp", "tgi", "openai"],
)
def test_auto_detects_each_kind_and_reads_its_context_length(
    tmp_path: Path, documents: dict[str, Any], kind: str, context: int | None, probes: list[str]
) -> None:
    with proxy(documents, tmp_path) as (url, engine, upstream):
        assert (engine.kind, engine.context_length) == (kind, context)
        assert _paths(upstream)[: len(probes)] == probes
        assert set(_paths(upstream)) == set(probes)  # later /v1/models refreshes ask nothing more
        card = httpx.get(url + "/v1/models").json()["data"][0]
        assert (card["id"], card["max_model_len"]) == (documents["/v1/models"]["data"][0]["id"], context)
        assert _kind_series(engine) == [(kind, 1.0)]


def test_a_loadlens_upstream_is_driven_as_vllm(tmp_path: Path) -> None:
    docs = {"/v1/models": {"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "loadlens"}]}}
    with proxy(docs, tmp_path) as (_, engine, _upstream):
        assert engine.kind == "vllm"
        assert engine.kind_evidence == "/v1/models owned_by vllm"


@pytest.mark.parametrize(
    ("documents", "kind", "load", "unload"),
    [
        (VLLM, "auto", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"),
        (SGLANG, "auto", "/load_lora_adapter", "/unload_lora_adapter"),
        ({**VLLM, **{k: v for k, v in SGLANG.items() if "lora" in k}}, "sglang", "/load_lora_adapter", None),
    ],
    ids=["vllm", "sglang", "sglang-by-flag"],
)
def test_adapters_go_to_each_kinds_endpoints(
    tmp_path: Path, documents: dict[str, Any], kind: str, load: str, unload: str | None
) -> None:
    (tmp_path / "sql").mkdir()
    with proxy(documents, tmp_path, kind) as (url, _engine, upstream):
        r = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": "sql"})
        assert r.status_code == 200, r.text
        assert _posts(upstream) == [(load, {"lora_name": "sql", "lora_path": str((tmp_path / "sql").resolve())})]
        r = httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": "sql"})
        assert r.status_code == 200, r.text
        assert _posts(upstream)[1:] == [(unload or "/unload_lora_adapter", {"lora_name": "sql"})]


def test_a_refused_sglang_adapter_call_keeps_its_status_and_message(tmp_path: Path) -> None:
    (tmp_path / "sql").mkdir()
    refused = (
        400,
        {"success": False, "error_message": "The LoRA adapter sql is already loaded.", "loaded_adapters": {}},
    )
    with proxy({**SGLANG, "/load_lora_adapter": refused}, tmp_path) as (url, _engine, _upstream):
        r = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": "sql"})
    assert r.status_code == 400
    assert r.json() == refused[1]  # the upstream's own body, forwarded


@pytest.mark.parametrize(
    ("documents", "kind", "says"),
    [
        (LLAMACPP, "llamacpp", "POST /lora-adapters"),
        (TGI, "tgi", "LORA_ADAPTERS"),
        (GENERIC, "openai", "--upstream-kind vllm or sglang"),
    ],
    ids=["llamacpp", "tgi", "openai"],
)
def test_upstreams_that_cannot_swap_adapters_answer_501_naming_the_kind(
    tmp_path: Path, documents: dict[str, Any], kind: str, says: str
) -> None:
    (tmp_path / "sql").mkdir()
    with proxy(documents, tmp_path) as (url, _engine, upstream):
        r = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": "sql"})
        assert (r.status_code, r.json()["error"]["type"]) == (501, "NotImplementedError")
        message = r.json()["error"]["message"]
        assert message.startswith(f"the {kind} upstream cannot load or unload LoRA adapters at runtime: ")
        assert says in message
        assert _posts(upstream) == []  # nothing was sent upstream


def test_the_flag_wins_over_detection_and_is_checked() -> None:
    engine = OpenAIProxyEngine("http://127.0.0.1:1", upstream_kind="tgi")
    assert (engine.kind, engine.kind_evidence) == ("tgi", "--upstream-kind")
    with pytest.raises(ValueError, match="upstream_kind must be auto or one of vllm, sglang, llamacpp, tgi, openai"):
        OpenAIProxyEngine("http://127.0.0.1:1", upstream_kind="ollama")


def test_an_upstream_without_models_is_generic(tmp_path: Path) -> None:
    with proxy({}, tmp_path) as (_url, engine, _upstream):
        assert (engine.kind, engine.kind_evidence) == ("openai", "/v1/models answered 404")


def test_an_upstream_unreachable_at_start_is_detected_when_first_needed(tmp_path: Path) -> None:
    port = free_port()
    engine = OpenAIProxyEngine(f"http://127.0.0.1:{port}")
    app = create_app(
        engine, ServeSettings(lora_root=tmp_path), registry=CollectorRegistry(), tracing=Tracing.disabled()
    )
    (tmp_path / "sql").mkdir()
    load = {"lora_name": "sql", "lora_path": "sql"}
    with serve_app(app) as url:
        assert engine.kind is None
        assert _kind_series(engine) == [(upstream_kinds.UNKNOWN, 1.0)]
        assert httpx.post(url + "/v1/load_lora_adapter", json=load).status_code == 503  # not known yet
        with ReplayUpstream(documents=LLAMACPP, port=port):
            r = httpx.post(url + "/v1/load_lora_adapter", json=load)
            assert r.status_code == 501
            assert (getattr(engine, "kind"), engine.context_length) == ("llamacpp", 4096)  # noqa: B009 (mypy narrowed it)


def test_detection_rules_on_the_documents() -> None:
    assert upstream_kinds.kind_from_models(VLLM["/v1/models"]) == "vllm"
    assert upstream_kinds.kind_from_models(TGI["/v1/models"]) is None
    assert upstream_kinds.may_be_tgi(TGI["/v1/models"]) and not upstream_kinds.may_be_tgi(GENERIC["/v1/models"])
    assert upstream_kinds.is_tgi_info(TGI["/info"]) and not upstream_kinds.is_tgi_info(LLAMACPP["/props"])
    assert upstream_kinds.context_from_llamacpp_props(LLAMACPP["/props"]) == 4096
    assert upstream_kinds.context_from_tgi_info(TGI["/info"]) == 4096
    assert upstream_kinds.context_from_sglang_server_info({"context_length": None}) is None
    assert upstream_kinds.context_from_models({"data": [{"id": "m", "max_model_len": True}]}) is None


def test_the_flag_reaches_the_engine_and_is_refused_for_the_sim(capsys: pytest.CaptureFixture[str]) -> None:
    from exporters.serving.cli import build_engine
    from loadlens.cli import build_parser, main

    args = build_parser().parse_args(
        ["serve", "--engine", "openai", "--upstream", "http://x:1", "--upstream-kind", "tgi"]
    )
    engine = build_engine(args, CollectorRegistry())
    assert (engine.kind, engine.configured_kind) == ("tgi", "tgi")
    assert main(["serve", "--engine", "sim", "--upstream-kind", "vllm"]) == 2
    assert capsys.readouterr().err.strip() == "loadlens serve: error: --upstream-kind applies to --engine openai only"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--upstream-kind", "ollama"])
