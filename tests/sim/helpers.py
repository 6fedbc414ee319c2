"""Small builders shared by the sim tests: requests, engines, stream collection, registry reads."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from exporters.serving.calibrate.replay import prompt_text
from exporters.serving.engine import GenerationRequest, LoRARequest, OutputEvent, RequestStream, SamplingParams
from exporters.serving.engines.sim import SimEngine, load_gpu_profile, load_model_profile
from exporters.serving.engines.sim.virtual_time import LoopTimer, running_virtual_loop

T = TypeVar("T")


def now() -> float:
    """The running loop's clock: ``time.monotonic()`` on a real loop, virtual time on a ``VirtualTimeLoop``."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


def prompt_of(tokens: int, salt: int = 0) -> str:
    """A prompt the sim tokenizer counts as exactly ``tokens`` tokens: three-letter words (" abc" is one
    piece of four characters). Different salts give different words, so prompts do not share cache blocks."""
    return prompt_text(tokens, salt)


def request(
    rid: str,
    prompt: str = "hello world",
    *,
    model: str = "tiny",
    max_tokens: int = 8,
    ignore_eos: bool = True,
    priority: int = 0,
    lora: LoRARequest | None = None,
    images: int = 0,
    endpoint: str = "chat",
    seed: int | None = None,
    temperature: float = 1.0,
    stop: Sequence[str] = (),
) -> GenerationRequest:
    return GenerationRequest(
        request_id=rid,
        endpoint="chat" if endpoint == "chat" else "completions",
        model=lora.lora_name if lora is not None else model,
        prompt=prompt,
        image_count=images,
        sampling=SamplingParams(
            max_tokens=max_tokens, temperature=temperature, seed=seed, stop=tuple(stop), ignore_eos=ignore_eos
        ),
        arrival_time=now(),
        priority=priority,
        lora=lora,
    )


def make_engine(
    model: str = "tiny",
    gpu: str = "h100-sxm",
    *,
    registry: CollectorRegistry | None = None,
    speed: float = 50.0,
    seed: int = 0,
    jitter: float = 0.0,
    enable_mfu_metrics: bool = False,
    **knobs: Any,
) -> tuple[SimEngine, CollectorRegistry]:
    """On a virtual-time loop (engines/sim/virtual_time.py) the engine runs on that loop's clock and timers."""
    reg = registry if registry is not None else CollectorRegistry()
    loop = running_virtual_loop()
    virtual: dict[str, Any] = {} if loop is None else {"clock": loop.time, "timer": LoopTimer}
    engine = SimEngine(
        load_model_profile(model),
        load_gpu_profile(gpu),
        registry=reg,
        speed=speed,
        seed=seed,
        jitter=jitter,
        knobs=knobs,
        enable_mfu_metrics=enable_mfu_metrics,
        **virtual,
    )
    return engine, reg


async def collect(stream: RequestStream) -> list[OutputEvent]:
    return [event async for event in stream]


def run(coro: Coroutine[Any, Any, T], timeout: float = 45.0) -> T:
    """Run one async test body with a hard timeout (a hang fails instead of eating the suite's budget)."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


async def until(predicate: Any, limit: float = 30.0) -> None:
    """Poll every millisecond of the loop's clock (virtual on a ``VirtualTimeLoop``). The limit only bounds a
    failure: generous, so a loaded machine never trips it."""
    deadline = now() + limit
    while not predicate():
        if now() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


async def gather(*aws: Awaitable[T]) -> list[T]:
    return list(await asyncio.gather(*aws))


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample value that must exist (``get_sample_value`` returns None for missing series)."""
    value = registry.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels} is missing"
    return value


def engine_labels(model: str = "tiny") -> dict[str, str]:
    return {"model_name": model, "engine": "0"}


def write_adapter(root: Path, name: str, *, r: int = 8, alpha: float = 16, modules: Any = ("q_proj", "v_proj")) -> Path:
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    doc = {"r": r, "lora_alpha": alpha, "target_modules": list(modules) if not isinstance(modules, str) else modules}
    (path / "adapter_config.json").write_text(json.dumps(doc), encoding="utf-8")
    return path
