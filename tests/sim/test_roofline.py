"""The roofline cost model: sizes, step terms, and the shapes of the curves it must produce."""

from __future__ import annotations

import pytest

from exporters.serving.engines.sim import load_gpu_profile, load_model_profile
from exporters.serving.engines.sim import roofline as rl
from exporters.serving.engines.sim.roofline import BatchShape, LoraWork
from tests.sim.roofline_shapes import compute_bound, decode_shape, prefill_shape

LLAMA = load_model_profile("deepseek-r1-distill-llama-8b")
QWEN = load_model_profile("qwen2-72b")
TINY = load_model_profile("tiny")
H100 = load_gpu_profile("h100-sxm")
A100 = load_gpu_profile("a100-40gb-pcie")


def test_kv_cache_sizes() -> None:
    assert rl.kv_bytes_per_token(LLAMA) == 2 * 32 * 8 * 128 * 2 == 131072
    assert rl.kv_block_bytes(LLAMA) == 16 * 131072
    assert rl.kv_bytes_per_token(QWEN) == 2 * 80 * 8 * 128 * 2


def test_weight_bytes_by_dtype() -> None:
    assert rl.weight_bytes(LLAMA) == LLAMA.params * 2
    linear = QWEN.layers * QWEN.layer_linear_params()
    assert rl.weight_bytes(QWEN) == int(linear * (0.5 + 2.5 / 128)) + (QWEN.params - linear) * 2
    assert 40e9 < rl.weight_bytes(QWEN) < 43e9  # the size of Qwen2-72B-Instruct-AWQ's safetensors


def test_num_gpu_blocks_is_the_memory_budget_over_block_size() -> None:
    budget = int(A100.memory_bytes * 0.9)
    expected = (
        budget - rl.weight_bytes(LLAMA) - rl.activation_bytes(LLAMA, 4096, 256) - A100.cuda_context_bytes
    ) // rl.kv_block_bytes(LLAMA)
    assert rl.num_gpu_blocks(LLAMA, A100, 0.9, 4096, 256) == expected
    assert expected * 16 > LLAMA.max_model_len  # one full-context sequence fits, as vLLM requires
    assert rl.num_gpu_blocks(QWEN, A100, 0.92, 4096, 256) < 0  # 41 GB of weights on a 40 GB card


def test_attention_pairs_count_the_causal_triangle() -> None:
    assert rl.attn_pairs(1, 0) == 1
    assert rl.attn_pairs(4, 0) == 10
    assert rl.attn_pairs(1, 100) == 101
    assert rl.attn_pairs(3, 10) == 30 + 6


def test_step_is_max_of_compute_and_memory_plus_overhead_for_a_mixed_batch() -> None:
    # One 100-token prefill chunk and three decodes at context 50.
    shape = BatchShape(num_tokens=103, num_seqs=4, num_sampled=4, attn_pairs=rl.attn_pairs(100, 0) + 3 * 51,
                       kv_read_tokens=150)  # fmt: skip
    cost = rl.step_cost(TINY, H100, shape)
    linear = TINY.layers * TINY.layer_linear_params()
    flops = 2 * linear * 103 + 2 * TINY.vocab * TINY.hidden * 4 + 4 * 4 * 4 * 64 * shape.attn_pairs
    assert cost.flops == flops
    assert cost.compute_seconds == pytest.approx(flops / (989.5e12 * 0.55))
    moved = linear * 2 + TINY.vocab * TINY.hidden * 2 + rl.kv_bytes_per_token(TINY) * (150 + 103)
    assert cost.bytes_moved == moved
    assert cost.memory_seconds == pytest.approx(moved / (3350e9 * 0.65))
    overhead = 0.0007 + 4 * 3e-6 + 4 * 2e-6
    assert cost.overhead_seconds == pytest.approx(overhead)
    assert cost.total_seconds == pytest.approx(overhead + max(cost.compute_seconds, cost.memory_seconds))
    assert cost.lora_seconds == cost.dequant_seconds == cost.stall_seconds == 0


def test_prefill_is_compute_bound_and_decode_memory_bound() -> None:
    assert compute_bound(rl.step_cost(LLAMA, H100, prefill_shape(2048)))
    assert not compute_bound(rl.step_cost(LLAMA, H100, decode_shape(8, 1000)))
    # Prefill time grows about linearly in prompt length once compute-bound.
    t1k = rl.step_cost(LLAMA, H100, prefill_shape(1000)).total_seconds
    t4k = rl.step_cost(LLAMA, H100, prefill_shape(4000)).total_seconds
    assert 3.5 < t4k / t1k < 4.5


def test_decode_throughput_rises_with_batch_until_compute_bound_then_flattens() -> None:
    batches = [2**i for i in range(13)]  # 1 .. 4096
    costs = [rl.step_cost(LLAMA, H100, decode_shape(b, 16)) for b in batches]
    tput = [b / c.total_seconds for b, c in zip(batches, costs, strict=True)]
    assert all(later >= earlier for earlier, later in zip(tput, tput[1:], strict=False))
    assert tput[1] / tput[0] > 1.9  # memory-bound: twice the batch is nearly twice the throughput
    assert not compute_bound(costs[0]) and compute_bound(costs[-1])
    assert tput[-1] / tput[-2] < 1.1  # compute-bound: flat
    ceiling = H100.peak_tensor_flops * H100.compute_efficiency / (2 * LLAMA.layers * LLAMA.layer_linear_params())
    assert tput[-1] < ceiling


def test_lora_cost_grows_sublinearly_with_rank() -> None:
    def lora(rank: int, tokens: int) -> float:
        params = rl.adapter_params(LLAMA, rank, ["q_proj", "v_proj"])
        return rl.lora_seconds(LLAMA, A100, [LoraWork(params=params, modules_per_layer=2, rank=rank, tokens=tokens)])

    for tokens in (1, 256):
        r2, r8, r32 = lora(2, tokens), lora(8, tokens), lora(32, tokens)
        assert r2 < r8 < r32
        assert r8 / r2 < 4 and r32 / r8 < 4  # sub-linear
    # With many tokens the matmuls dominate and follow r^0.6: 4x rank costs 4^0.6 = 2.3x.
    big = lora(32, 100_000) / lora(8, 100_000)
    assert big == pytest.approx(4**0.6, rel=0.02)


def test_adapter_sizes_and_load_times() -> None:
    params = rl.adapter_params(LLAMA, 64, ["q_proj", "k_proj", "v_proj", "o_proj"])
    assert params == 32 * 64 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096))
    sizes = rl.adapter_module_bytes(LLAMA, 64, ["q_proj", "v_proj"])
    assert len(sizes) == 64 and sizes[:2] == [64 * 8192 * 2, 64 * 5120 * 2]
    nbytes = params * 2
    host = rl.adapter_activate_seconds(A100, nbytes, from_disk=False)
    assert host == pytest.approx(0.02 + nbytes / 25e9)
    cold = rl.adapter_activate_seconds(A100, nbytes, from_disk=True)
    assert cold - host == pytest.approx(rl.adapter_read_seconds(A100, nbytes)) == pytest.approx(nbytes / 2e9)
    # Guide 2.4: a rank-64 Llama-3-8B hot swap blocks for about 87 ms on average; the sim's read + first
    # activation of a q/k/v/o adapter lands in the same range.
    assert 0.06 < rl.adapter_read_seconds(A100, nbytes) + host < 0.12


def test_awq_adds_a_dequantisation_term_and_streams_fewer_bytes() -> None:
    cost = rl.step_cost(QWEN, H100, decode_shape(1, 100))
    linear = QWEN.layers * QWEN.layer_linear_params()
    assert cost.dequant_seconds == pytest.approx(linear * 4 / (67e12 * 0.55))
    assert rl.streamed_weight_bytes(QWEN, images=False) < rl.weight_bytes(QWEN)
    assert rl.step_cost(LLAMA, H100, decode_shape(1, 100)).dequant_seconds == 0


def test_images_add_vision_flops_and_weights() -> None:
    vl = load_model_profile("deepseek-vl-7b")
    text = rl.step_cost(vl, A100, prefill_shape(600))
    image = rl.step_cost(vl, A100, prefill_shape(600, images=1))
    assert image.flops - text.flops == pytest.approx(vl.vision_flops_per_image)
    assert image.bytes_moved - text.bytes_moved == vl.vision_params * 2


def test_stall_and_overhead_are_not_busy_time() -> None:
    cost = rl.step_cost(TINY, H100, decode_shape(4, 10), stall_seconds=0.05)
    assert cost.total_seconds == pytest.approx(0.05 + cost.overhead_seconds + cost.busy_seconds)
    assert cost.busy_seconds == max(cost.compute_seconds, cost.memory_seconds)


def test_mfu_counts_by_hand_for_one_tiny_decode() -> None:
    """The FLOPs and bytes behind vllm:estimated_*_per_gpu_total, worked by hand for the tiny profile (4 layers,
    hidden 256, 4 heads and 2 KV heads of 64, MLP 768, vocabulary 32,000): one sequence decoding its 11th
    token. Linear parameters per layer: q 256·256 + k 256·128 + v 256·128 + o 256·256 + gate, up, down
    3 · 256·768 = 786,432; 4 layers = 3,145,728."""
    cost = rl.step_cost(TINY, H100, BatchShape(num_tokens=1, num_seqs=1, num_sampled=1, attn_pairs=11,
                                               kv_read_tokens=10))  # fmt: skip
    # 2·3,145,728 (decoder) + 2·32,000·256 (LM head) + 4·4 layers·4 heads·64·11 causal pairs
    assert cost.flops == 6_291_456 + 16_384_000 + 45_056 == 22_720_512
    # weights: 3,145,728·2 + 32,000·256·2 bytes; KV: 2 (K, V)·4 layers·2 heads·64·2 bytes = 2,048 per token,
    # for the 10 cached tokens read and the new one written
    assert rl.kv_bytes_per_token(TINY) == 2_048
    assert cost.bytes_moved == 6_291_456 + 16_384_000 + 2_048 * 11 == 22_697_984
