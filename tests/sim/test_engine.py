"""SimEngine end to end (asyncio, compressed time).

The engine's marks are delivery instants on its clock: the roofline figures (previous deadline + modeled
duration / speed) plus how late the loop woke. Tests that assert instants or anything that depends on when
things happen run on virtual time (``run_virtual``, engines/sim/virtual_time.py), where the loop wakes exactly at
its deadlines and the test's own sleeps are exact, so marks equal the modeled instants however busy the
machine is; on the real clock a test asserts only that no mark is before its modeled instant. Every latency
series is checked exactly against the marks. Scenarios that must batch deterministically on the real clock
submit every request in one event-loop tick behind a batching window, so the first step sees them all.
"""

from __future__ import annotations

import asyncio
import copy
import math
import statistics
from pathlib import Path

import pytest

from exporters.serving.engine import EngineError, ErrorKind, FinishReason, LoRARequest
from exporters.serving.engines.sim import ProfileError, SimEngine, load_gpu_profile, load_model_profile, roofline
from exporters.serving.engines.sim.roofline import BatchShape, attn_pairs, step_cost
from exporters.serving.engines.sim.virtual_time import run_virtual
from loadlens.contracts import mfu, model_config
from loadlens.contracts.device_state import DeviceState
from tests.sim.helpers import (
    collect,
    engine_labels,
    make_engine,
    now,
    prompt_of,
    request,
    run,
    sample,
    until,
    write_adapter,
)
from tests.sim.roofline_shapes import decode_shape, prefill_shape

WINDOW_US = 1e6  # 1 s modeled: with speed <= 50 that is >= 20 ms of wall time to submit a script in
EXACT = 1e-9
"""Differences of clock readings (~1e3 s virtual, ~1e5-1e6 s monotonic) carry ~1e-10 s of float error."""


@pytest.mark.parametrize("clock", ["virtual", "real"])
def test_single_request_ttft_and_itl_equal_the_roofline(clock: str) -> None:
    model, gpu = load_model_profile("deepseek-r1-distill-llama-8b"), load_gpu_profile("h100-sxm")
    speed = 20.0
    prompt_tokens = 300

    async def body() -> None:
        engine, reg = make_engine("deepseek-r1-distill-llama-8b", "h100-sxm", speed=speed)
        await engine.start()
        req = request("r1", prompt_of(prompt_tokens), model="deepseek-r1-distill-llama-8b", max_tokens=3)
        stream = await engine.generate(req)
        events = await collect(stream)
        await engine.stop()

        prefill = step_cost(model, gpu, prefill_shape(prompt_tokens)).total_seconds / speed
        decode1 = step_cost(model, gpu, decode_shape(1, prompt_tokens)).total_seconds / speed
        decode2 = step_cost(model, gpu, decode_shape(1, prompt_tokens + 1)).total_seconds / speed
        t = stream.timing
        assert t.queued is not None and t.scheduled is not None and t.first_token is not None
        assert t.finished is not None
        # The marks are instants of delivery: never before the modeled instant (idle engine, no batching
        # window: scheduled on arrival), later only by how late the loop woke. On virtual time it wakes at its
        # deadlines, so they are the modeled instants. On the real clock "never before" is the invariant (the
        # timer never wakes early); how late it wakes is the machine's, measured by benchmarks/sim_engine.py.
        marks = (t.scheduled - t.queued, t.first_token - t.queued, t.finished - t.queued)
        modeled = (0.0, prefill, prefill + decode1 + decode2)
        if clock == "virtual":
            assert marks == pytest.approx(modeled, abs=EXACT)
        else:
            assert all(mark >= instant for mark, instant in zip(marks, modeled, strict=True)), (marks, modeled)
        # Every latency series is exactly those marks.
        labels = engine_labels("deepseek-r1-distill-llama-8b")
        assert sample(reg, "vllm:time_to_first_token_seconds_sum", **labels) == pytest.approx(
            t.first_token - req.arrival_time, abs=1e-9
        )
        assert sample(reg, "vllm:inter_token_latency_seconds_count", **labels) == 2
        assert sample(reg, "vllm:inter_token_latency_seconds_sum", **labels) == pytest.approx(
            t.finished - t.first_token, abs=1e-9
        )
        assert sample(reg, "vllm:request_prefill_time_seconds_sum", **labels) == pytest.approx(
            t.first_token - t.scheduled, abs=1e-9
        )
        assert sample(reg, "vllm:e2e_request_latency_seconds_sum", **labels) == pytest.approx(
            t.finished - req.arrival_time, abs=1e-9
        )
        assert [e.output_tokens for e in events] == [1, 2, 3]
        assert events[-1].finish_reason is FinishReason.LENGTH
        assert all(e.prompt_tokens == prompt_tokens for e in events)

    (run_virtual if clock == "virtual" else run)(body())


def test_scripted_scenario_exact_metrics() -> None:
    """Two requests batched by the window: one prefill step, two decode steps; every series checked."""
    model, gpu = load_model_profile("tiny"), load_gpu_profile("h100-sxm")
    speed = 50.0

    async def body() -> None:
        engine, reg = make_engine(speed=speed, batching_window_us=WINDOW_US, enable_mfu_metrics=True)
        await engine.start()
        reqs = [request("a", prompt_of(40, 1), max_tokens=3), request("b", prompt_of(24, 2), max_tokens=3)]
        streams = [await engine.generate(r) for r in reqs]
        outs = await asyncio.gather(*(collect(s) for s in streams))
        await engine.stop()

        window = WINDOW_US * 1e-6 / speed
        costs = [
            step_cost(
                model,
                gpu,
                BatchShape(
                    num_tokens=64,
                    num_seqs=2,
                    num_sampled=2,
                    attn_pairs=attn_pairs(40, 0) + attn_pairs(24, 0),
                    kv_read_tokens=0,
                ),  # fmt: skip
            ),
            step_cost(
                model, gpu, BatchShape(num_tokens=2, num_seqs=2, num_sampled=2, attn_pairs=41 + 25, kv_read_tokens=64)
            ),
            step_cost(
                model, gpu, BatchShape(num_tokens=2, num_seqs=2, num_sampled=2, attn_pairs=42 + 26, kv_read_tokens=66)
            ),
        ]
        step1, step2, step3 = (c.total_seconds for c in costs)
        lab = engine_labels()
        t0 = streams[0].timing.queued
        assert t0 is not None
        for s in streams:
            # Virtual time: the loop wakes at its deadlines, so the marks are the modeled instants.
            assert s.timing.scheduled is not None and s.timing.first_token is not None
            assert s.timing.finished is not None
            assert s.timing.scheduled - t0 == pytest.approx(window, abs=EXACT)
            assert s.timing.first_token - t0 == pytest.approx(window + step1 / speed, abs=EXACT)
            assert s.timing.finished - t0 == pytest.approx(window + (step1 + step2 + step3) / speed, abs=EXACT)
        assert [e.output_tokens for e in outs[0]] == [1, 2, 3]
        assert sample(reg, "vllm:prompt_tokens_total", **lab) == 64
        assert sample(reg, "vllm:generation_tokens_total", **lab) == 6
        assert sample(reg, "vllm:request_success_total", **lab, finished_reason="length") == 2
        assert sample(reg, "vllm:request_success_total", **lab, finished_reason="stop") == 0
        assert sample(reg, "vllm:iteration_tokens_total_count", **lab) == 3
        assert sample(reg, "vllm:iteration_tokens_total_sum", **lab) == 64 + 6
        assert sample(reg, "vllm:iteration_tokens_total_bucket", **lab, le="64.0") == 2
        assert sample(reg, "vllm:iteration_tokens_total_bucket", **lab, le="128.0") == 3
        assert sample(reg, "vllm:request_prompt_tokens_sum", **lab) == 64
        assert sample(reg, "vllm:request_prompt_tokens_bucket", **lab, le="20.0") == 0
        assert sample(reg, "vllm:request_prompt_tokens_bucket", **lab, le="50.0") == 2
        assert sample(reg, "vllm:request_generation_tokens_sum", **lab) == 6
        assert sample(reg, "vllm:request_params_max_tokens_sum", **lab) == 6
        assert sample(reg, "vllm:request_params_n_sum", **lab) == 2
        assert sample(reg, "vllm:request_num_preemptions_sum", **lab) == 0
        assert sample(reg, "vllm:request_num_preemptions_count", **lab) == 2
        assert sample(reg, "vllm:request_prefill_kv_computed_tokens_sum", **lab) == 64
        assert sample(reg, "vllm:prefix_cache_queries_total", **lab) == 64
        assert sample(reg, "vllm:prefix_cache_hits_total", **lab) == 0
        assert sample(reg, "vllm:request_queue_time_seconds_sum", **lab) == pytest.approx(
            sum(s.timing.scheduled - s.timing.queued for s in streams if s.timing.scheduled and s.timing.queued)
        )
        # Both requests ran in the same steps, so they share their marks; every latency series is those marks.
        # Differences of monotonic timestamps (~1e5-1e6 s) carry ~1e-10 s of float error: compare to 1 ns.
        a = streams[0].timing
        assert a.first_token is not None and a.finished is not None and a.scheduled is not None
        for s in streams[1:]:
            assert (s.timing.scheduled, s.timing.first_token, s.timing.finished) == (
                a.scheduled, a.first_token, a.finished,
            )  # fmt: skip
        decode = a.finished - a.first_token
        assert decode == pytest.approx((step2 + step3) / speed, abs=EXACT)
        assert sample(reg, "vllm:request_decode_time_seconds_sum", **lab) == pytest.approx(2 * decode, abs=1e-9)
        assert sample(reg, "vllm:request_inference_time_seconds_sum", **lab) == pytest.approx(
            2 * (a.finished - a.scheduled), abs=1e-9
        )
        # TPOT = (e2e - ttft) / (n - 1) = decode / 2 for each request.
        assert sample(reg, "vllm:request_time_per_output_token_seconds_sum", **lab) == pytest.approx(decode, abs=1e-9)
        assert sample(reg, "vllm:inter_token_latency_seconds_count", **lab) == 4
        assert sample(reg, "loadlens_sim_step_duration_seconds_count") == 3
        assert sample(reg, "loadlens_sim_step_duration_seconds_sum") == pytest.approx(
            (step1 + step2 + step3) / speed, abs=1e-9
        )
        assert sample(reg, "loadlens_sim_batch_size_sum") == 6
        # vLLM's MFU counters (--enable-mfu-metrics) carry vLLM's estimate of the three steps (contracts/mfu.py):
        # both prefills (context = prompt), then two decode steps each (context = prompt + tokens so far), the
        # weights read once per step.
        work = mfu.Work(steps=3)
        for prompt in (40, 24):
            work.add(prompt, prompt, prefill=True)
            work.add(1, prompt + 1, prefill=False)
            work.add(1, prompt + 2, prefill=False)
        want = mfu.estimate(mfu.shape(model_config.from_model_profile(model)), work)
        assert sample(reg, "vllm:estimated_flops_per_gpu_total", **lab) == want.flops
        assert sample(reg, "vllm:estimated_write_bytes_per_gpu_total", **lab) == want.write_bytes
        assert sample(reg, "vllm:estimated_read_bytes_per_gpu_total", **lab) == want.read_bytes
        assert sample(reg, "loadlens_sim_timing_error_seconds_count") == 3
        assert sample(reg, "vllm:num_requests_running", **lab) == 0
        assert sample(reg, "vllm:kv_cache_usage_perc", **lab) == 0

    run_virtual(body())


def test_seeded_children_exist_at_zero_before_any_request() -> None:
    engine, reg = make_engine()
    lab = engine_labels()
    for reason in ("stop", "length", "abort", "error", "repetition"):
        assert sample(reg, "vllm:request_success_total", **lab, finished_reason=reason) == 0
    for reason in ("capacity", "deferred"):
        assert sample(reg, "vllm:num_requests_waiting_by_reason", **lab, reason=reason) == 0
    for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
        assert sample(reg, "vllm:admission_rejections_total", model_name="tiny", reason=reason) == 0
    assert sample(reg, "vllm:num_requests_running", **lab) == 0
    assert sample(reg, "vllm:time_to_first_token_seconds_count", **lab) == 0
    # vLLM 0.32 registers them on every server; no KV connector and no multi-modal input: they stay 0.
    for name in ("external_prefix_cache_queries", "external_prefix_cache_hits", "mm_cache_queries", "mm_cache_hits"):
        assert sample(reg, f"vllm:{name}_total", **lab) == 0
    blocks = engine.knobs()["num_gpu_blocks"]  # max_model_len 2048: 128 blocks per request
    info = _cache_labels(engine, blocks=str(blocks), override="None", concurrency=str(blocks / 128),
                         tokens=str(blocks * 16))  # fmt: skip
    assert sample(reg, "vllm:cache_config_info", **info) == 1
    assert reg.get_sample_value("vllm:lora_requests_info", {"max_lora": "1", "waiting_lora_adapters": "",
                                                            "running_lora_adapters": ""}) is not None  # fmt: skip


def test_kv_exhaustion_preempts_and_every_request_still_completes() -> None:
    async def body() -> None:
        # 128 blocks = one 2048-token sequence; six requests of 300 + 500 tokens need 50 blocks each.
        engine, reg = make_engine(speed=50.0, num_gpu_blocks=128, batching_window_us=WINDOW_US)
        await engine.start()
        streams = [await engine.generate(request(f"r{i}", prompt_of(300, i), max_tokens=500)) for i in range(6)]
        outs = await asyncio.gather(*(collect(s) for s in streams))
        lab = engine_labels()
        preemptions = sample(reg, "vllm:num_preemptions_total", **lab)
        assert preemptions > 0
        assert sum(s.timing.preemptions for s in streams) == preemptions
        assert sample(reg, "vllm:request_num_preemptions_sum", **lab) == preemptions
        assert all(o[-1].finish_reason is FinishReason.LENGTH and o[-1].output_tokens == 500 for o in outs)
        assert all(sum(e.new_tokens for e in o) == 500 for o in outs)
        assert sample(reg, "vllm:request_success_total", **lab, finished_reason="length") == 6
        assert sample(reg, "vllm:kv_cache_usage_perc", **lab) == 0
        # Recompute after preemption is not double counted as prompt tokens.
        assert sample(reg, "vllm:prompt_tokens_total", **lab) == 6 * 300
        await engine.stop()

    run(body())


def test_priority_requests_overtake_under_the_priority_policy() -> None:
    async def body(policy: str, priorities: list[int]) -> list[str]:
        engine, _ = make_engine(speed=50.0, scheduling_policy=policy, max_num_seqs=1, batching_window_us=WINDOW_US)
        await engine.start()
        streams = [
            await engine.generate(request(f"r{i}", prompt_of(10, i), max_tokens=2, priority=p))
            for i, p in enumerate(priorities)
        ]
        await asyncio.gather(*(collect(s) for s in streams))
        await engine.stop()
        return [s.request_id for s in sorted(streams, key=lambda s: s.timing.first_token or math.inf)]

    assert run(body("priority", [5, 0, -1, 0])) == ["r2", "r1", "r3", "r0"]
    assert run(body("fcfs", [0, 0, 0, 0])) == ["r0", "r1", "r2", "r3"]


def test_nonzero_priority_is_rejected_under_fcfs() -> None:
    async def body() -> None:
        engine, _ = make_engine()
        await engine.start()
        with pytest.raises(EngineError) as err:
            await engine.generate(request("p", priority=3))
        assert err.value.kind is ErrorKind.INVALID_REQUEST
        assert err.value.param == "priority"
        assert err.value.message == "Got priority 3 but Priority scheduling is not enabled."
        await engine.stop()

    run(body())


def test_wider_batching_window_raises_batch_size_and_ttft_at_low_load() -> None:
    async def body(window_us: float) -> tuple[float, float]:
        engine, reg = make_engine(speed=1.0, batching_window_us=window_us)
        await engine.start()
        streams = []
        for i in range(8):  # trickle: one request every 2 ms, each one step long (~0.7 ms)
            streams.append(await engine.generate(request(f"r{i}", prompt_of(20, i), max_tokens=1)))
            await asyncio.sleep(0.002)
        await asyncio.gather(*(collect(s) for s in streams))
        await engine.stop()
        batch = sample(reg, "loadlens_sim_batch_size_sum") / sample(reg, "loadlens_sim_batch_size_count")
        ttft = statistics.mean((s.timing.first_token or 0) - (s.timing.queued or 0) for s in streams)
        return batch, ttft

    # Virtual time: arrivals exactly 2 ms apart, steps exactly their modeled length.
    narrow_batch, narrow_ttft = run_virtual(body(0.0))
    wide_batch, wide_ttft = run_virtual(body(50_000.0))  # 50 ms: covers the whole 14 ms trickle
    assert wide_batch >= 2.0 * narrow_batch
    assert wide_ttft > narrow_ttft + 0.005
    # Narrow: each request is prefilled alone on arrival. Wide: the window the first arrival opened gathers all
    # eight into one step at 50 ms; they arrived 0..14 ms into it, 7 ms on average.
    model, gpu = load_model_profile("tiny"), load_gpu_profile("h100-sxm")
    alone = step_cost(model, gpu, prefill_shape(20)).total_seconds
    eight = step_cost(model, gpu, BatchShape(160, 8, 8, 8 * attn_pairs(20, 0), 0)).total_seconds
    assert (narrow_batch, wide_batch) == (1.0, 8.0)
    assert narrow_ttft == pytest.approx(alone, abs=EXACT)
    assert wide_ttft == pytest.approx(0.05 + eight - 0.007, abs=EXACT)


def test_queue_full_is_refused_with_retry_after_and_counted() -> None:
    async def body() -> None:
        engine, reg = make_engine(max_waiting=2)
        await engine.start()
        # No await yields to the loop between these calls, so all three see the same waiting queue.
        s1 = await engine.generate(request("a"))
        s2 = await engine.generate(request("b"))
        with pytest.raises(EngineError) as err:
            await engine.generate(request("c"))
        assert err.value.kind is ErrorKind.QUEUE_FULL
        assert err.value.retry_after_seconds == 1.0
        assert "waiting queue is full (2 requests)" in err.value.message
        assert sample(reg, "vllm:admission_rejections_total", model_name="tiny", reason="max_num_queued_reqs") == 1
        await asyncio.gather(collect(s1), collect(s2))
        await engine.stop()

    run(body())


def test_waiting_tokens_bound_is_refused_too() -> None:
    async def body() -> None:
        engine, reg = make_engine(max_waiting_tokens=100)
        await engine.start()
        s1 = await engine.generate(request("a", prompt_of(60)))
        with pytest.raises(EngineError) as err:
            await engine.generate(request("b", prompt_of(50, 1)))
        assert err.value.kind is ErrorKind.QUEUE_FULL
        assert sample(reg, "vllm:admission_rejections_total", model_name="tiny", reason="max_num_queued_tokens") == 1
        await collect(s1)
        await engine.stop()

    run(body())


def test_aclose_aborts_and_frees_slot_and_blocks() -> None:
    async def body() -> None:
        engine, reg = make_engine(speed=10.0)
        await engine.start()
        lab = engine_labels()
        stream = await engine.generate(request("long", prompt_of(100), max_tokens=1000))
        it = aiter(stream)
        await anext(it)
        await anext(it)
        assert sample(reg, "vllm:num_requests_running", **lab) == 1
        assert sample(reg, "vllm:kv_cache_usage_perc", **lab) > 0
        await stream.aclose()
        await until(lambda: reg.get_sample_value("vllm:num_requests_running", lab) == 0)
        assert sample(reg, "vllm:kv_cache_usage_perc", **lab) == 0
        assert sample(reg, "vllm:num_requests_waiting", **lab) == 0
        assert sample(reg, "vllm:request_success_total", **lab, finished_reason="abort") == 1
        assert sample(reg, "vllm:e2e_request_latency_seconds_count", **lab) == 0  # aborts: no histogram, as vLLM
        assert stream.timing.finished is not None
        with pytest.raises(StopAsyncIteration):
            await anext(it)
        await stream.aclose()  # idempotent
        assert sample(reg, "vllm:request_success_total", **lab, finished_reason="abort") == 1
        await engine.stop()

    run(body())


def test_abort_by_id_ends_the_stream_with_an_abort_event() -> None:
    async def body() -> None:
        engine, reg = make_engine(speed=10.0)
        await engine.start()
        stream = await engine.generate(request("x", max_tokens=1000))
        first = await anext(aiter(stream))
        await engine.abort("x")
        rest = await collect(stream)
        assert first.output_tokens == 1
        assert rest[-1].finish_reason is FinishReason.ABORT
        await engine.abort("x")  # unknown now: no-op
        assert sample(reg, "vllm:request_success_total", **engine_labels(), finished_reason="abort") == 1
        await engine.stop()

    run(body())


def test_context_overflow_uses_vllms_wording() -> None:
    async def body() -> None:
        engine, _ = make_engine()
        await engine.start()
        with pytest.raises(EngineError) as err:
            await engine.generate(request("big", prompt_of(100), max_tokens=2000))
        assert err.value.kind is ErrorKind.INVALID_REQUEST
        assert err.value.param == "messages"
        assert err.value.message == (
            "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens "
            "(100 in the messages, 2000 in the completion). Please reduce the length of the messages or completion."
        )
        with pytest.raises(EngineError) as err:
            await engine.generate(request("big2", prompt_of(100), max_tokens=1949, endpoint="completions", images=1))
        assert err.value.param == "prompt"
        assert "(116 in the messages, 1949 in the completion)" in err.value.message  # 16 tokens per image
        await engine.stop()

    run(body())


def test_unknown_model_and_stopped_engine_are_refused() -> None:
    async def body() -> None:
        engine, _ = make_engine()
        with pytest.raises(EngineError) as err:
            await engine.generate(request("early"))
        assert err.value.kind is ErrorKind.UNAVAILABLE
        await engine.start()
        with pytest.raises(EngineError) as err:
            await engine.generate(request("x", model="gpt-9"))
        assert err.value.kind is ErrorKind.NOT_FOUND
        assert err.value.message == "The model `gpt-9` does not exist."
        assert err.value.param == "model"
        assert (await engine.health()).ok
        await engine.stop()
        assert not (await engine.health()).ok

    run(body())


def test_natural_length_stop_strings_and_determinism() -> None:
    async def body(seed: int) -> list[tuple[str, int, FinishReason | None]]:
        engine, _ = make_engine(seed=seed, speed=200.0)
        await engine.start()
        out = []
        for i, kw in enumerate([{"ignore_eos": False, "max_tokens": 1000}, {"temperature": 0.0}, {"seed": 7}]):
            stream = await engine.generate(request(f"r{i}", "same prompt", **kw))  # type: ignore[arg-type]
            events = await collect(stream)
            out.append(("".join(e.text for e in events), events[-1].output_tokens, events[-1].finish_reason))
        await engine.stop()
        return out

    a, b, c = run(body(1)), run(body(1)), run(body(2))
    assert a == b
    assert a != c
    natural = a[0]
    assert natural[2] is FinishReason.STOP and 1 <= natural[1] < 1000
    assert len(natural[0].split(" ")) == natural[1]  # one pseudo-word per token


def test_temperature_zero_and_request_seed_make_text_depend_only_on_input() -> None:
    async def body() -> list[str]:
        engine, _ = make_engine(speed=200.0)
        await engine.start()
        texts = []
        for rid, kw in [("a", {"temperature": 0.0}), ("b", {}), ("c", {"temperature": 0.0}), ("d", {"seed": 3}),
                        ("e", {"seed": 3})]:  # fmt: skip
            events = await collect(await engine.generate(request(rid, "a prompt", max_tokens=12, **kw)))  # type: ignore[arg-type]
            texts.append("".join(e.text for e in events))
        await engine.stop()
        return texts

    greedy1, sampled, greedy2, seeded1, seeded2 = run(body())
    assert greedy1 == greedy2
    assert seeded1 == seeded2
    assert sampled != greedy1


def test_stop_string_truncates_text_and_sets_stop_reason() -> None:
    async def body() -> None:
        engine, _ = make_engine(speed=200.0)
        await engine.start()
        full = "".join(e.text for e in await collect(await engine.generate(request("f", "p", max_tokens=40, seed=1))))
        words = full.split(" ")
        stop = f"{words[5]} {words[6]}"  # spans two tokens
        events = await collect(await engine.generate(request("s", "p", max_tokens=40, seed=1, stop=[stop, "zzzzz"])))
        text = "".join(e.text for e in events)
        assert text == full[: full.index(stop)]
        assert events[-1].finish_reason is FinishReason.STOP
        assert events[-1].stop_reason == stop
        pieces = [words[0]] + [" " + w for w in words[1:]]
        end = full.index(stop) + len(stop)
        needed = next(k for k in range(1, len(pieces) + 1) if len("".join(pieces[:k])) >= end)
        assert events[-1].output_tokens == needed  # the token that completed the stop string counts
        assert stop not in "".join(e.text for e in events[:-1])
        await engine.stop()

    run(body())


def test_adapter_load_blocks_the_step_loop_and_is_charged_to_live_requests(tmp_path: Path) -> None:
    model, gpu = load_model_profile("deepseek-r1-distill-llama-8b"), load_gpu_profile("a100-80gb-sxm")
    speed = 50.0

    async def body() -> None:
        engine, reg = make_engine("deepseek-r1-distill-llama-8b", "a100-80gb-sxm", speed=speed)
        await engine.start()
        base = await engine.generate(request("base", prompt_of(50), model="deepseek-r1-distill-llama-8b",
                                             max_tokens=2000))  # fmt: skip
        it = aiter(base)
        await anext(it)
        lora = LoRARequest("sql", 1, str(write_adapter(tmp_path, "sql", r=8)))
        await engine.load_adapter(lora)
        assert [c.id for c in await engine.models()] == ["deepseek-r1-distill-llama-8b", "sql"]
        tuned = await engine.generate(request("tuned", prompt_of(20, 1), lora=lora, max_tokens=2))
        events = await collect(tuned)
        await base.aclose()
        await engine.stop()

        nbytes = roofline.adapter_params(model, 8, ["q_proj", "v_proj"]) * 2
        read = roofline.adapter_read_seconds(gpu, nbytes) / speed
        activate = roofline.adapter_activate_seconds(gpu, nbytes, from_disk=False) / speed
        assert nbytes == 32 * 8 * (4096 + 4096 + 4096 + 1024) * 2
        assert base.timing.lora_blocked_seconds == pytest.approx(read + activate, abs=1e-9)
        assert tuned.timing.lora_blocked_seconds == pytest.approx(activate, abs=1e-9)
        assert tuned.timing.first_token is not None and tuned.timing.scheduled is not None
        # The stall is inside its first step. On virtual time the loop is never behind (on the real clock one
        # that was would catch up through part of the stall), so the step from its planning to its token
        # lasts at least the stall.
        assert tuned.timing.first_token - tuned.timing.scheduled > activate
        assert sample(reg, "loadlens_sim_step_duration_seconds_sum") > activate
        assert sample(reg, "loadlens_sim_adapter_load_seconds_sum", source="storage") == pytest.approx(read)
        assert sample(reg, "loadlens_sim_adapter_load_seconds_sum", source="host") == pytest.approx(activate)
        assert events[-1].output_tokens == 2

    run_virtual(body())


def test_adapter_errors(tmp_path: Path) -> None:
    async def body() -> None:
        engine, _ = make_engine()
        await engine.start()
        good = LoRARequest("a", 1, str(write_adapter(tmp_path, "a", r=8)))
        await engine.load_adapter(good)
        cases = [
            (LoRARequest("a", 2, good.lora_path), ErrorKind.INVALID_REQUEST, "has already been loaded"),
            (LoRARequest("b", 3, str(tmp_path / "missing")), ErrorKind.INVALID_REQUEST, "No adapter found for"),
            (LoRARequest("c", 4, str(write_adapter(tmp_path, "c", r=64))), ErrorKind.INVALID_REQUEST,
             "LoRA rank 64 is greater than max_lora_rank 16."),
            (LoRARequest("d", 5, str(write_adapter(tmp_path, "d", modules=["lm_head"]))), ErrorKind.INVALID_REQUEST,
             "target module 'lm_head' is not a linear layer"),
            (LoRARequest("e", 6, str(write_adapter(tmp_path, "e", r=0))), ErrorKind.INVALID_REQUEST,
             "field 'r' must be a positive integer"),
        ]  # fmt: skip
        for lora, kind, text in cases:
            with pytest.raises(EngineError) as err:
                await engine.load_adapter(lora)
            assert err.value.kind is kind
            assert text in err.value.message
        (tmp_path / "f").mkdir()
        (tmp_path / "f" / "adapter_config.json").write_text("{not json", encoding="utf-8")
        with pytest.raises(EngineError, match="invalid adapter_config.json"):
            await engine.load_adapter(LoRARequest("f", 7, str(tmp_path / "f")))
        await engine.load_adapter(LoRARequest("g", 8, str(write_adapter(tmp_path, "g", modules="all-linear"))))
        await engine.load_adapter(LoRARequest("h", 9, str(write_adapter(tmp_path, "h", modules=r".*\.(q|v)_proj"))))
        with pytest.raises(EngineError) as err:
            await engine.unload_adapter("nope")
        assert err.value.kind is ErrorKind.NOT_FOUND
        assert err.value.message == "The lora adapter 'nope' cannot be found."
        await engine.unload_adapter("a")
        assert [c.id for c in await engine.models()] == ["tiny", "g", "h"]
        with pytest.raises(EngineError) as err:
            await engine.generate(request("x", lora=good))
        assert err.value.kind is ErrorKind.NOT_FOUND
        await engine.stop()

    run(body())


def test_three_adapters_in_rotation_swing_utilisation_more_than_one(tmp_path: Path) -> None:
    """Six closed-loop clients for 0.6 s of virtual time (so the schedule, not the machine, decides how many
    requests, swaps and utilisation samples there are)."""

    async def body(adapters: int) -> tuple[float, int]:
        engine, reg = make_engine("deepseek-r1-distill-llama-8b", "a100-80gb-sxm", speed=2.0)
        await engine.start()
        loras = [LoRARequest(f"t{i}", i + 1, str(write_adapter(tmp_path, f"t{i}"))) for i in range(adapters)]
        for lora in loras:
            await engine.load_adapter(lora)
        before = engine.device_state()["devices"][0]["util_samples"]
        since = before[-1]["timestamp_us"] if before else 0  # samples after the loads
        stop_at = now() + 0.6

        async def client(k: int) -> None:
            i = k
            while now() < stop_at:
                lora = loras[i % len(loras)]
                await collect(await engine.generate(request(f"c{k}-{i}", prompt_of(30, k), lora=lora, max_tokens=6)))
                i += 1

        await asyncio.gather(*(client(k) for k in range(6)))
        doc = engine.device_state(since)
        await engine.stop()
        util = [s["gpu_percent"] for s in doc["devices"][0]["util_samples"]][5:-5]
        util.sort()
        swing = util[int(0.95 * (len(util) - 1))] - util[int(0.05 * (len(util) - 1))]
        loads = int(sample(reg, "loadlens_sim_adapter_load_seconds_count", source="host"))
        loads += int(sample(reg, "loadlens_sim_adapter_load_seconds_count", source="storage"))
        return swing, loads

    one_swing, one_loads = run_virtual(body(1))
    three_swing, three_loads = run_virtual(body(3))
    assert three_loads > one_loads + 5  # max_loras = 1: every change of adapter is a swap
    assert three_swing > one_swing + 20.0


def test_device_state_document_validates_and_filters_by_since() -> None:
    async def body() -> None:
        engine, _ = make_engine(speed=5.0)
        await engine.start()
        await collect(await engine.generate(request("r", prompt_of(200), max_tokens=40)))
        await asyncio.sleep(0.03)
        doc = engine.device_state()
        state = DeviceState.model_validate(doc)
        dev = state.devices[0]
        assert dev.name == "NVIDIA H100 80GB HBM3"
        owners = dev.memory_by_owner
        assert dev.memory_used_bytes == sum(owners.model_dump().values())
        assert owners.kv_cache == engine.knobs()["num_gpu_blocks"] * roofline.kv_block_bytes(engine.model)
        assert owners.weights == roofline.weight_bytes(engine.model)
        stamps = [s.timestamp_us for s in dev.util_samples]
        assert stamps == sorted(stamps) and len(stamps) >= 3
        assert any(s.gpu_percent > 0 for s in dev.util_samples)
        later = engine.device_state(stamps[-2])
        assert [s["timestamp_us"] for s in later["devices"][0]["util_samples"]][:1] == [stamps[-1]]
        assert dev.processes[0].used_bytes == dev.memory_used_bytes
        await engine.stop()

    run(body())


def test_set_knobs_is_atomic_and_validated() -> None:
    async def body() -> None:
        engine, reg = make_engine()
        await engine.start()
        before = engine.knobs()
        with pytest.raises(EngineError) as err:
            await engine.set_knobs({"max_num_seqs": 8, "scheduling_policy": "lottery"})
        assert err.value.param == "scheduling_policy"
        assert engine.knobs() == before
        with pytest.raises(EngineError) as err:
            await engine.set_knobs({"max_model_len": 1024})
        assert err.value.param == "max_model_len"
        with pytest.raises(EngineError) as err:
            await engine.set_knobs({"num_gpu_blocks": 64})  # below one 2048-token sequence
        assert err.value.param == "num_gpu_blocks"
        assert "larger than the maximum number of tokens that can be stored in KV cache (1024)" in err.value.message
        after = await engine.set_knobs({"max_num_seqs": 8, "num_gpu_blocks": 500, "scheduling_policy": "priority"})
        assert after["max_num_seqs"] == 8 and after["num_gpu_blocks"] == 500
        # 500 blocks of 16 tokens, 128 of them per 2048-token request: 3.90625 requests, 8,000 tokens
        labels = _cache_labels(engine, blocks="500", override="500", concurrency="3.90625", tokens="8000")
        assert sample(reg, "vllm:cache_config_info", **labels) == 1
        reverted = await engine.set_knobs({"gpu_memory_utilization": 0.5})
        assert reverted["num_gpu_blocks"] == roofline.num_gpu_blocks(engine.model, engine.gpu, 0.5, 8192, 8)
        await engine.set_knobs({"max_model_len": 2048})  # unchanged value is fine
        await engine.stop()

    run(body())


def _cache_labels(engine: SimEngine, *, blocks: str, override: str, concurrency: str, tokens: str) -> dict[str, str]:
    """Every label of vLLM 0.32's ``vllm:cache_config_info`` as the sim writes it."""
    k = engine.knobs()
    return {
        "_block_size_resolved": "True",
        "block_size": "16",
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": "16",
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(k["enable_prefix_caching"]),
        "gpu_memory_utilization": str(k["gpu_memory_utilization"]),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": concurrency,
        "kv_cache_memory_bytes": "None",
        "kv_cache_size_tokens": tokens,
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": blocks,
        "num_gpu_blocks_override": override,
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
        "engine": "0",
    }


def test_shrinking_the_kv_cache_preempts_and_requests_still_finish() -> None:
    async def body() -> None:
        engine, reg = make_engine(speed=20.0, num_gpu_blocks=600, batching_window_us=WINDOW_US)
        await engine.start()
        streams = [await engine.generate(request(f"r{i}", prompt_of(400, i), max_tokens=300)) for i in range(4)]
        await until(lambda: all(s.timing.first_token for s in streams))
        await engine.set_knobs({"num_gpu_blocks": 128})
        outs = await asyncio.gather(*(collect(s) for s in streams))
        # Virtual time: the knob change lands within 1 ms (the poll) of the first tokens, every time, with most
        # of the 300 tokens still to go; four 700-token sequences need 176 blocks of the 128 left.
        assert sample(reg, "vllm:num_preemptions_total", **engine_labels()) == 2
        assert sum(s.timing.preemptions for s in streams) == 2
        assert all(o[-1].output_tokens == 300 for o in outs)
        await engine.stop()

    run_virtual(body())


def test_prefix_cache_hits_are_counted_in_tokens() -> None:
    async def body() -> None:
        engine, reg = make_engine(speed=200.0)
        await engine.start()
        shared = prompt_of(100, 5)
        await collect(await engine.generate(request("a", shared, max_tokens=2)))
        second = await collect(await engine.generate(request("b", shared, max_tokens=2)))
        lab = engine_labels()
        assert sample(reg, "vllm:prefix_cache_queries_total", **lab) == 200
        assert sample(reg, "vllm:prefix_cache_hits_total", **lab) == 96  # six full blocks; 99 is the cap
        assert second[0].cached_tokens == 96
        assert sample(reg, "vllm:request_prefill_kv_computed_tokens_sum", **lab) == 100 + 4
        # vLLM's by-source split: computed + cache hits = prompt tokens; every hit is the GPU prefix cache's.
        assert sample(reg, "vllm:prompt_tokens_total", **lab) == 200
        assert sample(reg, "vllm:prompt_tokens_by_source_total", **lab, source="local_compute") == 104
        assert sample(reg, "vllm:prompt_tokens_by_source_total", **lab, source="local_cache_hit") == 96
        assert sample(reg, "vllm:prompt_tokens_by_source_total", **lab, source="external_kv_transfer") == 0
        assert sample(reg, "vllm:prompt_tokens_cached_total", **lab) == 96
        assert sample(reg, "vllm:prompt_tokens_cached_by_source_total", **lab, source="device") == 96
        for tier in ("host", "p2p", "disk", "external_unspecified"):
            assert sample(reg, "vllm:prompt_tokens_cached_by_source_total", **lab, source=tier) == 0
        await engine.stop()

    run(body())


def test_profiles_that_do_not_fit_and_bad_constructor_arguments() -> None:
    registry_kw = {"registry": __import__("prometheus_client").CollectorRegistry()}
    with pytest.raises(ProfileError, match="field 'dtype'"):
        SimEngine(load_model_profile("qwen2-72b"), load_gpu_profile("a100-40gb-pcie"), **registry_kw)
    with pytest.raises(EngineError) as err:
        make_engine(max_num_seqs=0)
    assert err.value.param == "max_num_seqs"
    with pytest.raises(EngineError) as err:
        make_engine(max_model_len=4096)
    assert err.value.param == "max_model_len"
    with pytest.raises(ValueError, match="speed"):
        make_engine(speed=0.0)


def test_a_crashed_loop_fails_requests_and_reports_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        engine, reg = make_engine()
        await engine.start()

        def boom(cutoff: float) -> None:
            raise RuntimeError("boom")

        monkeypatch.setattr(engine._sched, "schedule", boom)
        events = await collect(await engine.generate(request("x")))
        assert events[-1].finish_reason is FinishReason.ERROR
        health = await engine.health()
        assert not health.ok and "boom" in health.detail
        with pytest.raises(EngineError) as err:
            await engine.generate(request("y"))
        assert err.value.kind is ErrorKind.INTERNAL
        assert sample(reg, "vllm:request_success_total", **engine_labels(), finished_reason="error") == 1
        await engine.stop()

    run(body())


def test_an_adapter_that_does_not_fit_fails_its_requests_with_error(tmp_path: Path) -> None:
    async def body() -> None:
        # gpu_memory_utilization 1.0 leaves the driver's reservation overcommitted: any new allocation fails.
        engine, reg = make_engine(gpu_memory_utilization=1.0, speed=100.0)
        await engine.start()
        lora = LoRARequest("big", 1, str(write_adapter(tmp_path, "big")))
        await engine.load_adapter(lora)
        events = await collect(await engine.generate(request("x", lora=lora)))
        assert events[-1].finish_reason is FinishReason.ERROR
        base = await collect(await engine.generate(request("y")))
        assert base[-1].finish_reason is FinishReason.LENGTH
        allocator = engine.device_state()["devices"][0]["allocator"]
        assert (allocator["alloc_retries"], allocator["ooms"]) == (1, 1)
        assert sample(reg, "vllm:request_success_total", **engine_labels(), finished_reason="error") == 1
        await engine.stop()

    run(body())


def test_runtime_knob_changes_take_effect(tmp_path: Path) -> None:
    async def body() -> None:
        engine, reg = make_engine(speed=200.0, max_loras=2)
        await engine.start()
        loras = [LoRARequest(n, i + 1, str(write_adapter(tmp_path, n))) for i, n in enumerate("ab")]
        for lora in loras:
            await engine.load_adapter(lora)
        streams = [await engine.generate(request(f"r{lora.lora_name}", lora=lora)) for lora in loras]
        await asyncio.gather(*(collect(s) for s in streams))

        def adapters_bytes() -> int:
            return int(engine.device_state()["devices"][0]["memory_by_owner"]["adapters"])

        two = adapters_bytes()
        blocks = engine.knobs()["num_gpu_blocks"]
        await engine.set_knobs({"max_loras": 1, "max_num_batched_tokens": 4096, "enable_prefix_caching": False})
        assert engine.knobs()["num_gpu_blocks"] == blocks  # only the memory knobs resize the cache
        assert adapters_bytes() == two // 2  # the idle slot beyond max_loras is evicted
        assert reg.get_sample_value(
            "vllm:lora_requests_info", {"max_lora": "1", "waiting_lora_adapters": "", "running_lora_adapters": ""}
        )
        shared = prompt_of(64, 9)
        for rid in ("p1", "p2"):
            await collect(await engine.generate(request(rid, shared, max_tokens=1)))
        assert sample(reg, "vllm:prefix_cache_hits_total", **engine_labels()) == 0
        await engine.stop()

    run(body())


def test_stop_during_an_adapter_load_fails_the_load_instead_of_hanging(tmp_path: Path) -> None:
    async def body() -> None:
        engine, _ = make_engine(speed=0.001)  # the 0.16 ms read of this adapter takes 0.16 s of wall time
        await engine.start()
        path = write_adapter(tmp_path, "a", modules="all-linear")
        load = asyncio.create_task(engine.load_adapter(LoRARequest("a", 1, str(path))))
        await asyncio.sleep(0.02)
        await engine.stop()
        with pytest.raises(EngineError) as err:
            await load
        assert err.value.kind is ErrorKind.UNAVAILABLE

    run(body())


def test_jitter_is_seeded() -> None:
    async def body(seed: int, jitter: float) -> float:
        engine, reg = make_engine(speed=50.0, seed=seed, jitter=jitter, batching_window_us=WINDOW_US)
        await engine.start()
        streams = [await engine.generate(request(f"r{i}", prompt_of(30, i), max_tokens=20)) for i in range(3)]
        await asyncio.gather(*(collect(s) for s in streams))
        await engine.stop()
        return sample(reg, "loadlens_sim_step_duration_seconds_sum")

    steady = run(body(1, 0.0))
    jittered = run(body(1, 0.3))
    assert jittered == run(body(1, 0.3))
    assert jittered != steady and jittered != run(body(2, 0.3))
    assert steady == run(body(2, 0.0))  # without jitter the seed changes text, not time


def test_generate_leaves_the_callers_request_unchanged() -> None:
    async def body() -> None:
        engine, reg = make_engine(speed=200.0)
        await engine.start()
        req = request("r", prompt_of(48), max_tokens=0)  # chat without max_tokens: the context's rest
        before = copy.deepcopy(req)
        events = await collect(await engine.generate(req))
        await engine.stop()
        assert req == before
        assert req.sampling.max_tokens == 0
        assert events[-1].output_tokens == 2048 - 48
        assert sample(reg, "vllm:request_params_max_tokens_sum", **engine_labels()) == 2048 - 48

    run(body())


def test_a_lagging_loop_counts_late_steps_and_warns_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    """Every wake-up 60 ms late: each step is a late step, the lag gauge shows it while running and drops to 0
    when idle, the warning is logged once (rate-limited), and TTFT is what the consumer saw. Virtual time: the
    60 ms are exact, and the consumer takes its token in the instant the loop hands it over."""

    async def body() -> None:
        engine, reg = make_engine(speed=1.0)
        real = engine._sleep_until

        async def late(when: float) -> None:
            await real(max(when, now()) + 0.06)

        engine._sleep_until = late  # type: ignore[method-assign]
        await engine.start()
        req = request("r1", max_tokens=4)
        stream = await engine.generate(req)
        seen: list[float] = []
        async for _ in stream:
            seen.append(now())
            if len(seen) == 2:
                assert sample(reg, "loadlens_sim_lag_seconds") >= 0.06
        await until(lambda: sample(reg, "loadlens_sim_lag_seconds") == 0.0)
        await engine.stop()
        steps = sample(reg, "loadlens_sim_timing_error_seconds_count")
        assert steps == 4
        assert sample(reg, "loadlens_sim_late_steps_total") == steps
        ttft = sample(reg, "vllm:time_to_first_token_seconds_sum", **engine_labels())
        # Measured, not modeled (the modeled TTFT is ~1 ms): when the consumer got the token.
        assert seen[0] - req.arrival_time == pytest.approx(ttft, abs=EXACT)
        assert ttft > 0.06

    with caplog.at_level("WARNING", logger="exporters.serving.engines.sim.engine"):
        run_virtual(body())
    warnings = [r for r in caplog.records if "behind real time" in r.getMessage()]
    assert len(warnings) == 1
