"""``make demo``: start the simulated server and stream requests through it, printing what it measured.

The server simulates the guide's core benchmark setup (DeepSeek-VL-7B on an A100 40GB PCIe) with the
priority scheduler on. The demo streams one request token by token, then a concurrent burst of mixed
interactive/batch requests (one with an image), and prints the client's view next to the server's own
metrics and the simulated GPU state. Environment: ``LOADLENS_DEMO_PORT`` (default: a free port),
``LOADLENS_DEMO_SPEED`` (default 1: real time).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from exporters.common.net import free_port

MODEL = "deepseek-vl-7b"
GPU = "a100-40gb-pcie"
RUN_DIR = Path(".run/demo")
# A 1x1 PNG: the sim counts image parts as the model's image tokens; the pixels do not matter.
PNG_1PX = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d4944415478da6364f8ff"
        "bf1e0005fe02fea7d5e2f50000000049454e44ae426082"
    )
).decode()


@dataclass
class Result:
    label: str
    priority: int
    ttft_s: float | None
    e2e_s: float
    tokens: int
    status: int


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"demo: the server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    sys.exit(f"demo: the server did not become healthy in {timeout_s:.0f} s; see {log}")


async def _stream(client: httpx.AsyncClient, label: str, body: dict[str, object], echo: bool = False) -> Result:
    started = time.monotonic()
    ttft: float | None = None
    tokens = 0
    raw_priority = body.get("priority")
    priority = raw_priority if isinstance(raw_priority, int) else 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return Result(label, priority, None, time.monotonic() - started, 0, response.status_code)
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage") and not chunk.get("choices"):
                tokens = chunk["usage"]["completion_tokens"]
                continue
            text = chunk["choices"][0]["delta"].get("content") or ""
            if text and ttft is None:
                ttft = time.monotonic() - started
            if echo and text:
                print(text, end="", flush=True)
    if echo:
        print()
    return Result(label, priority, ttft, time.monotonic() - started, tokens, 200)


def _chat(prompt: str, max_tokens: int, priority: int = 0, image: bool = False) -> dict[str, object]:
    content: object = prompt
    if image:
        content = [
            {"type": "text", "text": prompt},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_1PX}"}},
        ]
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "priority": priority,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _traffic(url: str) -> list[Result]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        print("\n1) One streamed request (tokens as they arrive):\n")
        first = await _stream(client, "single", _chat("Explain continuous batching in one paragraph.", 48), echo=True)
        print(
            "\n2) A burst of 12 concurrent requests: 8 interactive (priority 0), 4 batch (priority 1), one with"
            " an image"
        )
        burst = [
            _stream(client, f"chat-{i}", _chat(f"Question {i}: what limits decode throughput?", 64, 0, image=(i == 0)))
            for i in range(8)
        ] + [_stream(client, f"batch-{i}", _chat("Summarise this report. " * 40, 128, 1)) for i in range(4)]
        return [first, *await asyncio.gather(*burst)]


def _metric(text: str, name: str, labels: str = "") -> float | None:
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*{re.escape(labels)}[^}}]*\}})? (\S+)$", re.MULTILINE)
    values = [float(m.group(2)) for m in pattern.finditer(text)]
    return sum(values) if values else None


def _report(results: list[Result], metrics: str, device: dict[str, object]) -> None:
    print("\nClient view:")
    print(f"  {'request':<10} {'prio':>4} {'status':>6} {'TTFT ms':>9} {'E2E ms':>9} {'tokens':>7} {'tok/s':>7}")
    for r in results:
        ttft = f"{r.ttft_s * 1000:9.1f}" if r.ttft_s is not None else f"{'-':>9}"
        rate = r.tokens / r.e2e_s if r.e2e_s > 0 else 0.0
        print(f"  {r.label:<10} {r.priority:>4} {r.status:>6} {ttft} {r.e2e_s * 1000:9.1f} {r.tokens:>7} {rate:7.1f}")

    def mean(name: str) -> str:
        total, count = _metric(metrics, name + "_sum"), _metric(metrics, name + "_count")
        return f"{total / count * 1000:.1f} ms" if total is not None and count else "n/a"

    print("\nServer view (/metrics):")
    print(f"  vllm:time_to_first_token_seconds mean          {mean('vllm:time_to_first_token_seconds')}")
    print(f"  gen_ai_server_time_to_first_token_seconds mean {mean('gen_ai_server_time_to_first_token_seconds')}")
    print(f"  vllm:inter_token_latency_seconds mean          {mean('vllm:inter_token_latency_seconds')}")
    print(f"  vllm:request_queue_time_seconds mean           {mean('vllm:request_queue_time_seconds')}")
    print(f"  vllm:generation_tokens_total                   {_metric(metrics, 'vllm:generation_tokens_total')}")
    print(f"  vllm:num_preemptions_total                     {_metric(metrics, 'vllm:num_preemptions_total')}")
    print(f"  loadlens_goodput_requests_total                {_metric(metrics, 'loadlens_goodput_requests_total')}")
    print(f"  loadlens_sla_breaches_total                    {_metric(metrics, 'loadlens_sla_breaches_total')}")
    devices = device.get("devices")
    if isinstance(devices, list) and devices:
        d = devices[0]
        owners = d.get("memory_by_owner", {})
        gib = 1024**3
        print(f"\nSimulated GPU ({d.get('name')}, /sim/device-state):")
        print(
            f"  memory used {d.get('memory_used_bytes', 0) / gib:.1f} of {d.get('memory_total_bytes', 0) / gib:.1f} GiB"
        )
        print("  by owner: " + ", ".join(f"{k} {v / gib:.2f} GiB" for k, v in owners.items()))
        print(f"  power {d.get('power_watts', 0):.0f} W, {len(d.get('util_samples', []))} utilisation samples")


def main() -> int:
    port = int(os.environ.get("LOADLENS_DEMO_PORT") or free_port())
    speed = os.environ.get("LOADLENS_DEMO_SPEED", "1")
    url = f"http://127.0.0.1:{port}"
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    log = RUN_DIR / "serve.log"
    cmd = [
        sys.executable, "-m", "exporters.cli", "serve", "--engine", "sim", "--model-profile", MODEL,
        "--gpu-profile", GPU, "--port", str(port), "--speed", speed, "--knob", "scheduling_policy=priority",
    ]  # fmt: skip
    print(f"demo: starting {' '.join(cmd[2:])}\n      request log: {log}")
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(url, proc, log)
            print(f"demo: {url} is up (model {MODEL} on a simulated {GPU})")
            results = asyncio.run(_traffic(url))
            metrics = httpx.get(url + "/metrics").text
            device = httpx.get(url + "/sim/device-state").json()
            _report(results, metrics, device)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    failed = [r for r in results if r.status != 200]
    print(f"\ndemo: done. {len(results) - len(failed)}/{len(results)} requests succeeded. Next: `make test`.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
