"""The sim's API-server (frontend) stage (exporters/serving/engines/sim/frontend.py), on virtual time: a request
enters the waiting queue ``frontend_fixed_seconds`` after its arrival stamp; a step's tokens reach the streams,
and vLLM's TTFT and E2E, ``frontend_per_running_seconds`` × the step's sequences after the step ends; the
engine's marks, ITL, queue, prefill and decode are the engine's instants (vLLM's engine-core stamps)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from exporters.serving.engines.sim import load_gpu_profile
from exporters.serving.engines.sim.frontend import Frontend
from exporters.serving.engines.sim.roofline import step_cost
from exporters.serving.engines.sim.virtual_time import run_virtual
from loadlens.contracts.gpu_profile import GPU_DIR
from loadlens.contracts.model_profile import load_model_profile
from tests.sim.helpers import engine_labels, make_engine, now, prompt_of, request, sample
from tests.sim.roofline_shapes import decode_shape, prefill_shape

FIXED, PER_RUNNING, SPEED = 0.004, 0.0005, 2.0


def frontend_gpu(tmp: Path, fixed: float = FIXED, per_running: float = PER_RUNNING) -> str:
    doc = yaml.safe_load((GPU_DIR / "h100-sxm.yaml").read_text(encoding="utf-8"))
    doc.update(frontend_fixed_seconds=fixed, frontend_per_running_seconds=per_running)
    path = tmp / "h100-frontend.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return str(path)


def test_a_request_waits_the_input_part_and_its_tokens_the_output_part(tmp_path: Path) -> None:
    model, gpu = load_model_profile("tiny"), load_gpu_profile("h100-sxm")
    prefill = step_cost(model, gpu, prefill_shape(100)).total_seconds / SPEED
    decode1 = step_cost(model, gpu, decode_shape(1, 100)).total_seconds / SPEED
    decode2 = step_cost(model, gpu, decode_shape(1, 101)).total_seconds / SPEED
    out = PER_RUNNING / SPEED  # one sequence in every step

    async def body() -> None:
        engine, reg = make_engine(gpu=frontend_gpu(tmp_path), speed=SPEED)
        await engine.start()
        req = request("r1", prompt_of(100), max_tokens=3)
        stream = await engine.generate(req)
        seen = [now() async for _ in stream]
        await engine.stop()
        t = stream.timing
        assert t.queued is not None and t.scheduled is not None and t.first_token is not None
        assert t.finished is not None
        arrival = req.arrival_time
        # Engine marks: queued after the input part, then the roofline steps.
        assert t.queued - arrival == pytest.approx(FIXED / SPEED, abs=1e-9)
        assert (t.scheduled - t.queued, t.first_token - t.scheduled, t.finished - t.first_token) == pytest.approx(
            (0.0, prefill, decode1 + decode2), abs=1e-9
        )
        # The stream gets each step's token the output part after the step's end.
        first_end = t.first_token
        assert [s - arrival for s in seen] == pytest.approx(
            [first_end - arrival + out, first_end + decode1 - arrival + out, t.finished - arrival + out], abs=1e-9
        )
        labels = engine_labels()
        # vLLM's TTFT and E2E end when the API server sees the token; ITL, queue, prefill, decode are engine stamps.
        assert sample(reg, "vllm:time_to_first_token_seconds_sum", **labels) == pytest.approx(
            t.first_token + out - arrival, abs=1e-9
        )
        assert sample(reg, "vllm:e2e_request_latency_seconds_sum", **labels) == pytest.approx(
            t.finished + out - arrival, abs=1e-9
        )
        assert sample(reg, "vllm:inter_token_latency_seconds_sum", **labels) == pytest.approx(
            decode1 + decode2, abs=1e-9
        )
        assert sample(reg, "vllm:request_queue_time_seconds_sum", **labels) == pytest.approx(0.0, abs=1e-9)
        assert sample(reg, "vllm:request_decode_time_seconds_sum", **labels) == pytest.approx(
            decode1 + decode2, abs=1e-9
        )
        assert sample(reg, "vllm:request_time_per_output_token_seconds_sum", **labels) == pytest.approx(
            (decode1 + decode2) / 2, abs=1e-9
        )

    run_virtual(body())


def test_the_output_part_grows_with_the_steps_sequences_and_keeps_order(tmp_path: Path) -> None:
    gpu = load_gpu_profile(frontend_gpu(tmp_path, fixed=0.0, per_running=0.002))

    async def body() -> list[float]:
        front = Frontend(gpu, 1.0, now)
        t0 = now()
        seen = [front.output(t0, 5)[0], front.output(t0 + 0.001, 1)[0], front.output(t0 + 0.02, 2)[0]]
        return [s - t0 for s in seen]

    # 5 sequences: 10 ms; 1 sequence a millisecond later would be seen at 3 ms, before the previous step's
    # tokens: it waits for them (10 ms); 2 sequences at 20 ms: 24 ms.
    assert run_virtual(body()) == pytest.approx([0.010, 0.010, 0.024], abs=1e-12)


def test_without_the_stage_nothing_waits(tmp_path: Path) -> None:
    gpu = load_gpu_profile(frontend_gpu(tmp_path, fixed=0.0, per_running=0.0))

    async def body() -> tuple[float, float, object]:
        front = Frontend(gpu, 1.0, now)
        t0 = now()
        await front.enter()
        seen, deliver = front.output(t0, 7)
        return now() - t0, seen - t0, deliver

    assert run_virtual(body()) == (0.0, 0.0, None)
