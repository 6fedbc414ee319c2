"""The sim's scheduler defaults per card are vLLM's: each packaged GPU profile, started with no knobs, has the
``max_num_seqs`` and ``max_num_batched_tokens`` that vLLM's own ``EngineArgs.get_batch_defaults`` picks for an
API server on that card (vLLM 0.32: 1,024 and 8,192 on an H100 or H200, 256 and 2,048 on an A100; a card of
160 GB or more would get 16,384).

vLLM decides from its platform's device memory and name; the CPU build's platform is the CPU, so the check runs
vLLM's function in its own environment with the platform replaced by one that reports the profile's
``memory_bytes`` and ``marketing_name`` (what NVML and CUDA report on that card) and is neither a CPU nor a TPU.
The CPU rig's limits (``tests/support/vllm_server.SCHEDULER_LIMITS``, what ``benchmarks.calibration_vllm``
tells ``loadlens calibrate``) are read the same way, from a platform that is the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from exporters.serving.engines.sim.knob_plan import startup_knobs, startup_state
from loadlens.contracts.gpu_profile import GPU_DIR, load_gpu_profile
from loadlens.contracts.model_profile import load_model_profile
from tests.support import required
from tests.support import vllm_server as rig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PROBE = """
import json, sys
from vllm.engine import arg_utils
from vllm.usage.usage_lib import UsageContext

class Card:
    def __init__(self, memory, name, cpu=False):
        self.memory, self.name, self.cpu = memory, name, cpu
    def get_device_total_memory(self, device_id=0):
        return self.memory
    def get_device_name(self, device_id=0):
        return self.name
    def is_tpu(self):
        return False
    def is_cpu(self):
        return self.cpu

out = {}
for key, (memory, name, cpu) in json.loads(sys.argv[1]).items():
    arg_utils.current_platform = Card(memory, name, cpu)
    tokens, seqs = arg_utils.EngineArgs.get_batch_defaults(world_size=1)
    out[key] = [seqs[UsageContext.OPENAI_API_SERVER], tokens[UsageContext.OPENAI_API_SERVER]]
print(json.dumps(out))
"""


def test_each_gpu_profile_starts_with_vllms_batch_defaults_for_its_card() -> None:
    exe = rig.python()
    if exe is None:
        required.unavailable(f"vLLM's CPU build is not installed at {rig.venv()}: make vllm-env")
    profiles = {p.stem: load_gpu_profile(p.stem) for p in sorted(GPU_DIR.glob("*.yaml"))}
    assert set(profiles) == {"a100-40gb-pcie", "a100-80gb-sxm", "h100-sxm", "h200"}
    cards = {name: (g.memory_bytes, g.marketing_name, False) for name, g in profiles.items()}
    cards["cpu"] = (24 * 2**30, "cpu", True)  # the CPU rig (this machine's memory; the CPU branch ignores it)
    proc = subprocess.run(
        [str(exe), "-c", PROBE, json.dumps(cards)],
        capture_output=True,
        text=True,
        timeout=100,
        env={**os.environ, **rig.ENV},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    vllm = {k: tuple(v) for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
    model = load_model_profile("deepseek-r1-distill-llama-8b")  # sets no scheduler knob of its own
    sim = {}
    for name, gpu in profiles.items():
        knobs = startup_state(model, gpu, None).knobs
        assert (knobs.max_num_seqs, knobs.max_num_batched_tokens) == (
            startup_knobs(gpu).max_num_seqs, startup_knobs(gpu).max_num_batched_tokens)  # fmt: skip
        sim[name] = (knobs.max_num_seqs, knobs.max_num_batched_tokens)
    assert {**sim, "cpu": tuple(rig.SCHEDULER_LIMITS.values())} == vllm
    assert vllm == {
        "a100-40gb-pcie": (256, 2048),
        "a100-80gb-sxm": (256, 2048),
        "h100-sxm": (1024, 8192),
        "h200": (1024, 8192),
        "cpu": (128, 2048),
    }
