"""What the ``openai`` proxy knows about each kind of upstream server: its adapter endpoints, where its
context length comes from, and how ``--upstream-kind auto`` recognises it (docs/serving.md, *Upstream kinds*).

Pure functions over the upstream's JSON documents, so each rule is tested with the documents' real shapes;
the proxy engine makes the HTTP calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KINDS: tuple[str, ...] = ("vllm", "sglang", "llamacpp", "tgi", "openai")
"""The values of ``--upstream-kind`` besides ``auto``, and of the ``upstream_kind`` label."""
UNKNOWN = "unknown"
"""The label before ``auto`` has seen the upstream answer (it was unreachable at start)."""
KIND_LABELS: tuple[str, ...] = (*KINDS, UNKNOWN)


@dataclass(frozen=True)
class Dialect:
    kind: str
    load_path: str | None
    """POST path that loads an adapter from ``{"lora_name", "lora_path"}``; None: the upstream cannot."""
    unload_path: str | None
    no_swap_reason: str = ""
    """Why the upstream cannot load adapters at runtime (the 501 message), when it cannot."""


DIALECTS: Mapping[str, Dialect] = {
    "vllm": Dialect("vllm", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"),
    "sglang": Dialect("sglang", "/load_lora_adapter", "/unload_lora_adapter"),
    "llamacpp": Dialect(
        "llamacpp",
        None,
        None,
        "llama.cpp's server takes its adapters at start (--lora) and only changes their scales at runtime "
        "(POST /lora-adapters)",
    ),
    "tgi": Dialect(
        "tgi",
        None,
        None,
        "text-generation-inference loads its adapters at start (LORA_ADAPTERS) and has no runtime load endpoint",
    ),
    "openai": Dialect(
        "openai",
        None,
        None,
        "a generic OpenAI-compatible server has no known adapter endpoint (pass --upstream-kind vllm or sglang "
        "if it speaks one of theirs)",
    ),
}

# /v1/models ``owned_by`` of each server's cards. loadlens serves vLLM's API (its LoRA endpoints and
# max_model_len), so a loadlens upstream is driven as vLLM.
_OWNED_BY = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llamacpp", "loadlens": "vllm"}


def _first_card(models: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    data = models.get("data") if models else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return data[0]
    return None


def kind_from_models(models: Mapping[str, Any] | None) -> str | None:
    """The kind a ``GET /v1/models`` answer names by its first card's ``owned_by``, or None."""
    card = _first_card(models)
    owner = card.get("owned_by") if card else None
    return _OWNED_BY.get(owner) if isinstance(owner, str) else None


def may_be_tgi(models: Mapping[str, Any] | None) -> bool:
    """TGI's /v1/models card is owned by the model itself (``owned_by`` = ``id``) and ``created`` 0: worth
    asking its ``/info``. Anything else is not probed, so a generic server sees no extra requests."""
    card = _first_card(models)
    return bool(card) and card.get("owned_by") == card.get("id") and card.get("created") == 0  # type: ignore[union-attr]


def is_tgi_info(info: Mapping[str, Any] | None) -> bool:
    """TGI's ``GET /info`` names its router."""
    return bool(info) and info.get("router") == "text-generation-router"  # type: ignore[union-attr]


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def context_from_models(models: Mapping[str, Any] | None) -> int | None:
    """vLLM's (and newer sglang's) ``max_model_len`` on the first /v1/models card."""
    card = _first_card(models)
    return _positive_int(card.get("max_model_len")) if card else None


def context_from_llamacpp_props(props: Mapping[str, Any] | None) -> int | None:
    """llama.cpp ``GET /props``: ``default_generation_settings.n_ctx``, the context of one slot (the server's
    ``-c`` divided among its ``-np`` slots), which is what one request can use."""
    settings = props.get("default_generation_settings") if props else None
    return _positive_int(settings.get("n_ctx")) if isinstance(settings, dict) else None


def context_from_tgi_info(info: Mapping[str, Any] | None) -> int | None:
    """TGI ``GET /info``: ``max_total_tokens`` (prompt plus output; ``max_input_tokens`` bounds the prompt)."""
    return _positive_int(info.get("max_total_tokens")) if info else None


def context_from_sglang_server_info(info: Mapping[str, Any] | None) -> int | None:
    """sglang ``GET /get_server_info``: its server arguments, ``context_length`` when it was set."""
    return _positive_int(info.get("context_length")) if info else None
