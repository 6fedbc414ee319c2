"""``parse_kv_capacity``: the KV capacity a server states in ``vllm:cache_config_info``, exactly, or None."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from exporters.serving.engines.sim.knobs import Knobs
from exporters.serving.engines.sim.kv_sizing import cache_config_info
from exporters.serving.engines.sim.roofline import BLOCK_SIZE
from loadlens.contracts.kv_capacity import KvCapacity, parse_kv_capacity

LINE = 'vllm:cache_config_info{block_size="%s",cache_dtype="auto",num_gpu_blocks="%s",engine="%s"} 1.0'


def test_reads_blocks_and_block_size() -> None:
    capacity = parse_kv_capacity("# TYPE vllm:cache_config_info gauge\n" + LINE % ("128", "16384", "0") + "\n")
    assert capacity == KvCapacity(blocks=16384, block_size=128)
    assert capacity is not None and capacity.tokens == 2_097_152


def test_the_smallest_engine_and_quoted_labels() -> None:
    text = "\n".join([
        LINE % ("16", "900", "0"),
        'vllm:cache_config_info{a="x\\"y,num_gpu_blocks=\\"1\\"",block_size="16",num_gpu_blocks="800",engine="1"} 1.0',
        LINE % ("16", "1000", "2"),
    ])  # fmt: skip
    assert parse_kv_capacity(text) == KvCapacity(blocks=800, block_size=16)


def test_no_stated_capacity_is_none() -> None:
    assert parse_kv_capacity("") is None
    assert parse_kv_capacity("vllm:num_requests_running 0.0\nsglang:token_usage 0.1\n") is None
    assert parse_kv_capacity(LINE % ("16", "None", "0")) is None  # before the engine profiled its memory
    assert parse_kv_capacity(LINE % ("sixteen", "10", "0")) is None
    assert parse_kv_capacity(LINE % ("16", "0", "0")) is None


def test_reads_the_sims_exposition() -> None:
    knobs = Knobs(num_gpu_blocks=4321)
    labels = cache_config_info(knobs, 4321)
    registry = CollectorRegistry()
    gauge = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", [*labels, "engine"],
                  registry=registry)  # fmt: skip
    gauge.labels(**labels, engine="0").set(1)
    assert parse_kv_capacity(generate_latest(registry).decode()) == KvCapacity(blocks=4321, block_size=BLOCK_SIZE)
