"""The engine reports what it does as records (stats.py) to its stat loggers; only the Prometheus logger knows
series. A recording logger next to it sees the exact record sequence of a scripted workload, and the series
are those records' sums."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporters.serving.engine import EngineError, ErrorKind, FinishReason, LoRARequest
from exporters.serving.engines.sim import SimEngine, load_gpu_profile, load_model_profile, roofline
from exporters.serving.engines.sim.roofline import BatchShape, attn_pairs, step_cost
from exporters.serving.engines.sim.stats import (
    AdapterRead,
    EarlyEnd,
    EngineEvent,
    EngineStats,
    KnobChange,
    LoraStats,
    Rejection,
    SchedulerStats,
    StatLoggers,
    StepStats,
)
from loadlens.contracts import mfu, model_config
from tests.sim.helpers import collect, engine_labels, prompt_of, request, run, sample, until, write_adapter
from tests.support.paths import ROOT

ENGINE_PY = ROOT / "exporters" / "serving" / "engines" / "sim" / "engine.py"
SPEED = 50.0


class Recorder:
    """A stat logger that keeps every record it is handed."""

    def __init__(self) -> None:
        self.records: list[StepStats | EngineStats | EngineEvent] = []

    def record_step(self, step: StepStats) -> None:
        self.records.append(step)

    def record(self, stats: EngineStats) -> None:
        self.records.append(stats)

    def record_event(self, event: EngineEvent) -> None:
        self.records.append(event)

    def idle(self) -> bool:
        last = self.records[-1] if self.records else None
        return isinstance(last, EngineStats) and last.idle


def queue(running: int, blocks: int, num_blocks: int) -> SchedulerStats:
    return SchedulerStats(running, 0, 0, blocks / num_blocks)


def test_a_scripted_workload_hands_the_loggers_its_exact_records(tmp_path: Path) -> None:
    """Two requests batched by the window (one prefill step, two decode steps) and a third refused by a full
    queue; then, idle: an abort, a knob change, an adapter load, and stop."""
    model, gpu = load_model_profile("tiny"), load_gpu_profile("h100-sxm")
    rec = Recorder()

    async def body() -> CollectorRegistry:
        reg = CollectorRegistry()
        engine = SimEngine(model, gpu, registry=reg, speed=SPEED, stat_loggers=[rec], enable_mfu_metrics=True,
                           knobs={"batching_window_us": 1e6, "max_waiting": 2})  # fmt: skip
        num_blocks = engine.knobs()["num_gpu_blocks"]
        await engine.start()
        # Submitted in one tick: the loop first runs behind the window, with both waiting.
        streams = [await engine.generate(request("a", prompt_of(40, 1), max_tokens=3)),
                   await engine.generate(request("b", prompt_of(24, 2), max_tokens=3))]  # fmt: skip
        with pytest.raises(EngineError) as refused:
            await engine.generate(request("c", max_tokens=3))
        assert refused.value.kind is ErrorKind.QUEUE_FULL
        await asyncio.gather(*(collect(s) for s in streams))
        await until(rec.idle)
        n_run = len(rec.records)
        await engine.generate(request("d", max_tokens=3))
        await engine.abort("d")
        await until(lambda: len(rec.records) > n_run + 1)  # the loop woke for "d", found nothing, idles again
        await engine.set_knobs({"enable_prefix_caching": False})
        await engine.load_adapter(LoRARequest("sql", 1, str(write_adapter(tmp_path, "sql", r=8))))
        await engine.stop()

        costs = [
            step_cost(model, gpu, BatchShape(num_tokens=64, num_seqs=2, num_sampled=2,
                                             attn_pairs=attn_pairs(40, 0) + attn_pairs(24, 0), kv_read_tokens=0)),
            step_cost(model, gpu, BatchShape(num_tokens=2, num_seqs=2, num_sampled=2, attn_pairs=41 + 25,
                                             kv_read_tokens=64)),
            step_cost(model, gpu, BatchShape(num_tokens=2, num_seqs=2, num_sampled=2, attn_pairs=42 + 26,
                                             kv_read_tokens=66)),
        ]  # fmt: skip
        # vLLM's MFU estimate of each step (contracts/mfu.py): the two prefills, then one decode each per step.
        entries = [[(40, 40, True), (24, 24, True)], [(1, 41, False), (1, 25, False)], [(1, 42, False), (1, 26, False)]]
        shape_of = mfu.shape(model_config.from_model_profile(model))
        steps = [r for r in rec.records if isinstance(r, StepStats)]
        assert [(s.num_seqs, s.num_preempted, s.prefix_queries, s.prefix_hits, s.adapter_loads) for s in steps] == [
            (2, 0, 64, 0, []), (2, 0, 0, 0, []), (2, 0, 0, 0, []),
        ]  # fmt: skip
        for s, cost, step_entries in zip(steps, costs, entries, strict=True):
            assert s.duration_seconds == pytest.approx(cost.total_seconds / SPEED, abs=1e-9)
            work = mfu.Work(steps=1)
            for n, context, prefill in step_entries:
                work.add(n, context, prefill=prefill)
            want = mfu.estimate(shape_of, work)
            assert (s.flops, s.read_bytes, s.write_bytes) == (want.flops, want.read_bytes, want.write_bytes)

        # Every record in order: steps and their outcomes, events, and each published queue.
        def shape(r: StepStats | EngineStats | EngineEvent) -> object:
            if isinstance(r, StepStats):
                return "step"
            if isinstance(r, AdapterRead):
                return "adapter read"
            if not isinstance(r, EngineStats):
                return r
            it = r.iteration
            return (
                r.scheduler, r.lora, r.wakeup is not None, r.idle,
                None if it is None else (
                    it.num_generation_tokens, it.num_prompt_tokens, it.num_cached_prompt_tokens,
                    len(it.time_to_first_tokens), len(it.inter_token_latencies),
                    [(f.reason, f.prompt_tokens, f.output_tokens, f.computed_prompt_tokens, f.preemptions)
                     for f in it.finished_requests],
                ),
            )  # fmt: skip

        idle = queue(0, 0, num_blocks)
        sql = LoraStats(1, (), ())  # max_loras 1; no request uses the adapter
        info = KnobChange(0, dict(_cache_info(reg)))  # the cache configuration now, as the series labels it
        done = [(FinishReason.LENGTH, 40, 3, 40, 0), (FinishReason.LENGTH, 24, 3, 24, 0)]
        assert [shape(r) for r in rec.records] == [
            Rejection("max_num_queued_reqs"),
            "step", (queue(2, 5, num_blocks), None, True, False, (2, 64, 0, 2, 0, [])),
            "step", (queue(2, 5, num_blocks), None, True, False, (2, 0, 0, 0, 2, [])),
            "step", (idle, None, True, False, (2, 0, 0, 0, 2, done)),
            (idle, None, False, True, None),  # the loop idles
            EarlyEnd(FinishReason.ABORT),
            (idle, None, False, True, None),
            info, (idle, None, False, False, None),
            "adapter read", (idle, sql, True, False, None), (idle, sql, False, True, None),
            (idle, sql, False, False, None),  # stop
        ]  # fmt: skip
        (read,) = [r for r in rec.records if isinstance(r, AdapterRead)]
        nbytes = roofline.adapter_params(model, 8, ["q_proj", "v_proj"]) * roofline.LORA_DTYPE_BYTES
        assert read.seconds == pytest.approx(roofline.adapter_read_seconds(gpu, nbytes) / SPEED, abs=1e-9)
        return reg

    reg = run(body())
    # The Prometheus logger got the same records: its series are their sums.
    lab = engine_labels()
    outcomes = [r for r in rec.records if isinstance(r, EngineStats)]
    its = [r.iteration for r in outcomes if r.iteration is not None]
    wakeups = [r.wakeup for r in outcomes if r.wakeup is not None]
    steps = [r for r in rec.records if isinstance(r, StepStats)]
    assert sample(reg, "vllm:time_to_first_token_seconds_sum", **lab) == sum(
        t for i in its for t in i.time_to_first_tokens
    )
    assert sample(reg, "vllm:inter_token_latency_seconds_sum", **lab) == sum(
        t for i in its for t in i.inter_token_latencies
    )
    assert sample(reg, "loadlens_sim_step_duration_seconds_sum") == sum(s.duration_seconds for s in steps)
    assert sample(reg, "loadlens_sim_timing_error_seconds_count") == len(wakeups) == 4
    assert sample(reg, "loadlens_sim_timing_error_seconds_sum") == sum(max(w.late_seconds, 0.0) for w in wakeups)
    assert sample(reg, "loadlens_sim_adapter_load_seconds_sum", source="storage") == next(
        r.seconds for r in rec.records if isinstance(r, AdapterRead)
    )
    assert sample(reg, "vllm:admission_rejections_total", model_name="tiny", reason="max_num_queued_reqs") == 1
    assert sample(reg, "vllm:request_success_total", **lab, finished_reason="abort") == 1
    assert sample(reg, "vllm:request_success_total", **lab, finished_reason="length") == 2
    assert dict(_cache_info(reg))["enable_prefix_caching"] == "False"
    assert sample(reg, "loadlens_sim_lag_seconds") == 0.0  # reset when the loop idled


def _cache_info(reg: CollectorRegistry) -> list[tuple[str, str]]:
    """The labels of the one ``vllm:cache_config_info`` child, in order, less ``engine``."""
    (labels,) = [s.labels for m in reg.collect() for s in m.samples if s.name == "vllm:cache_config_info"]
    return [(k, v) for k, v in labels.items() if k != "engine"]


def test_stat_loggers_hand_every_record_to_each_logger_in_order() -> None:
    first, second = Recorder(), Recorder()
    both = StatLoggers([first, second])
    records: list[StepStats | EngineStats | EngineEvent] = [
        StepStats(0.001, 1), EngineStats(SchedulerStats(1, 0, 0, 0.5), None), Rejection("max_num_queued_tokens"),
    ]  # fmt: skip
    both.record_step(StepStats(0.001, 1))
    both.record(EngineStats(SchedulerStats(1, 0, 0, 0.5), None))
    both.record_event(Rejection("max_num_queued_tokens"))
    assert first.records == second.records == records


def test_the_engine_knows_no_series() -> None:
    """engine.py hands records to a StatLogger: no runtime prometheus_client import, no metric object, no
    series name (the registry is only passed through to the Prometheus logger)."""
    tree = ast.parse(ENGINE_PY.read_text())
    type_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for node in ast.walk(block)
    }
    runtime_imports = [
        node.module if isinstance(node, ast.ImportFrom) else ", ".join(a.name for a in node.names)
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in type_only
    ]
    assert not [m for m in runtime_imports if m and m.startswith("prometheus_client")]
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    strings = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]
    assert not [s for s in strings if "vllm:" in s or "loadlens_sim_" in s]
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "_metrics" not in attributes
    # The logger is only constructed: every later use goes through the StatLogger methods.
    assert {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and _is_self_stats(n.value)} == {
        "record_step", "record", "record_event",
    }  # fmt: skip


def _is_self_stats(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "_stats" and isinstance(node.value, ast.Name)
