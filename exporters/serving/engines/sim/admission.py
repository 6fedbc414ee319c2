"""Admission checks on a request, before it enters the engine: everything that depends on the request and
the knobs alone. Queue bounds (which depend on the engine's state) and the model lookup are the engine's."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from exporters.serving.engine import EngineError, ErrorKind, GenerationRequest
from exporters.serving.engines.sim.knobs import Knobs
from exporters.serving.engines.sim.tokenizer import encode
from loadlens.contracts.model_profile import ModelProfile


@dataclass(frozen=True, slots=True)
class Admitted:
    ids: tuple[int, ...]
    """Token ids of the prompt text (images follow them)."""
    prompt_tokens: int
    """Text tokens plus image tokens."""
    max_tokens: int
    """The request's ``max_tokens``, or (when it set none) what the context leaves, as vLLM does. The engine
    keeps this rather than writing it back into the caller's request."""


def check_request(
    request: GenerationRequest,
    knobs: Knobs,
    model: ModelProfile,
    served_model_name: str,
    live_ids: Container[str],
) -> Admitted:
    """Raise the first ``INVALID_REQUEST`` that applies, in vLLM's order; else size the prompt."""
    sp = request.sampling
    field = "messages" if request.endpoint == "chat" else "prompt"
    if sp.max_tokens < 0:
        raise EngineError(ErrorKind.INVALID_REQUEST, f"max_tokens must be at least 1, got {sp.max_tokens}",
                          param="max_tokens")  # fmt: skip
    if request.priority != 0 and knobs.scheduling_policy != "priority":
        raise EngineError(
            ErrorKind.INVALID_REQUEST,
            f"Got priority {request.priority} but Priority scheduling is not enabled.",
            param="priority",
        )
    if request.image_count and not model.image_tokens_per_image:
        raise EngineError(ErrorKind.INVALID_REQUEST, f"model {served_model_name} does not accept images",
                          param=field)  # fmt: skip
    if request.request_id in live_ids:
        raise EngineError(ErrorKind.INVALID_REQUEST, f"Request id {request.request_id} already running.")
    ids = encode(request.prompt, model.vocab)
    prompt_tokens = len(ids) + request.image_count * model.image_tokens_per_image
    max_tokens = sp.max_tokens
    if max_tokens == 0:
        # No max_tokens (chat): as vLLM, generate up to what the context leaves.
        max_tokens = max(1, knobs.max_model_len - prompt_tokens)
    if prompt_tokens + max_tokens > knobs.max_model_len:
        raise EngineError(
            ErrorKind.INVALID_REQUEST,
            f"This model's maximum context length is {knobs.max_model_len} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
            param=field,
        )
    return Admitted(ids=ids, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
