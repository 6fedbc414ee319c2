"""guidellm against the sim, offline, with the tokenizer ``loadlens serve --write-tokenizer`` writes (issue 13).

Run: ``python -m benchmarks.guidellm_check [--requests N] [--streams S]`` with guidellm importable. guidellm
is not in the dev extra: it brings pandas, pyarrow, datasets and a newer click. Install it apart, without
replacing this venv's packages, and point ``PYTHONPATH`` at it. (Its only other heavy dependency, torch, is
already here as the CPU build.)

    pip install --target /tmp/glsite --no-deps guidellm Faker aiofiles aiologic click culsans datasets dill \
        eval_type_backport ftfy h2 hpack html5tagger hyperframe loguru more-itertools multidict multiprocess \
        pandas pyarrow pydantic-settings sanic sanic-routing tabulate tracerite ujson wcwidth wrapt xxhash
    PYTHONPATH=/tmp/glsite python -m benchmarks.guidellm_check

It writes the ``tiny`` tokenizer into a temporary directory and starts ``loadlens serve --model-profile tiny``.
Then it runs ``guidellm run`` with ``HF_HUB_OFFLINE=1``, synthetic prompts of 256 tokens, 64 output tokens,
S concurrent streams and N requests, against ``/v1/chat/completions``. It compares guidellm's JSON report
with the server's own series, as means: TTFT against ``gen_ai_server_time_to_first_token_seconds`` and
``vllm:time_to_first_token_seconds``; ITL against ``loadlens_inter_token_latency_seconds`` and
``vllm:inter_token_latency_seconds``; output and prompt tokens against ``loadlens_output_tokens_total`` and
``gen_ai_server_token_usage``. Prompt tokens count the chat template's 9 tokens too, as vLLM counts them.
Exit 1 if guidellm fails, if any token total differs, or if the mean ITL differs by more than 5 %. TTFT
is reported and not judged: guidellm's TTFT includes its own client time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import httpx

from loadlens.util.child import http_child
from loadlens.util.net import free_port


def _series_sum(metrics: str, name: str, must: Sequence[str] = ()) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and all(m in line for m in must):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--streams", type=int, default=4)
    args = ap.parse_args(argv)
    try:
        import guidellm  # noqa: F401
    except ImportError:
        print("guidellm is not importable: see this module's docstring", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        tok = Path(tmp) / "tokenizer"
        py = sys.executable
        subprocess.run(
            [py, "-m", "loadlens.cli", "serve", "--model-profile", "tiny", "--write-tokenizer", str(tok)],
            check=True,
            capture_output=True,
        )
        port = free_port()
        serve = [py, "-m", "loadlens.cli", "serve", "--model-profile", "tiny", "--port", str(port)]
        with http_child([*serve, "--log-level", "error"], port) as url:
            out = Path(tmp) / "guidellm.json"
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
            cmd = [
                py,
                "-m",
                "guidellm",
                "run",
                "--backend",
                f"kind=openai_http,target={url},model=tiny",
                "--profile",
                f"kind=concurrent,streams={args.streams}",
                "--constraint",
                f"kind=max_requests,count={args.requests}",
                "--data",
                "kind=synthetic_text,prompt_tokens=256,output_tokens=64",
                "--tokenizer",
                f"kind=huggingface_auto,model={tok}",
                "--output",
                f"kind=json,path={out}",
                "--disable-console",
            ]
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=600, check=False)
            if proc.returncode != 0 or not out.exists():
                print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
                return 1
            metrics = httpx.get(url + "/metrics").text
            report = json.loads(out.read_text())
    m = report["benchmarks"][0]["metrics"]

    def gl(key: str, field: str = "mean") -> float:
        return float(m[key]["successful"][field])

    chat = ('gen_ai_operation_name="chat"',)
    server = {
        "ttft_ms": 1000
        * _series_sum(metrics, "gen_ai_server_time_to_first_token_seconds_sum", chat)
        / max(1.0, _series_sum(metrics, "gen_ai_server_time_to_first_token_seconds_count", chat)),
        "vllm_ttft_ms": 1000
        * _series_sum(metrics, "vllm:time_to_first_token_seconds_sum")
        / max(1.0, _series_sum(metrics, "vllm:time_to_first_token_seconds_count")),
        "itl_ms": 1000
        * _series_sum(metrics, "loadlens_inter_token_latency_seconds_sum")
        / max(1.0, _series_sum(metrics, "loadlens_inter_token_latency_seconds_count")),
        "vllm_itl_ms": 1000
        * _series_sum(metrics, "vllm:inter_token_latency_seconds_sum")
        / max(1.0, _series_sum(metrics, "vllm:inter_token_latency_seconds_count")),
        "output_tokens": _series_sum(metrics, "loadlens_output_tokens_total"),
        "prompt_tokens": _series_sum(metrics, "gen_ai_server_token_usage_sum", ('gen_ai_token_type="input"',)),
    }
    client = {
        "ttft_ms": gl("time_to_first_token_ms"),
        "itl_ms": gl("inter_token_latency_ms"),
        "output_tokens": gl("output_token_count", "total_sum"),
        "prompt_tokens": gl("prompt_token_count", "total_sum"),
        "output_tok_s": gl("output_tokens_per_second"),
    }
    print(f"guidellm vs the sim's own series: {args.requests} requests, {args.streams} streams, 256 -> 64 tokens")
    print(f"  TTFT mean        guidellm {client['ttft_ms']:8.2f} ms   gen_ai {server['ttft_ms']:8.2f} ms   "
          f"vllm {server['vllm_ttft_ms']:8.2f} ms")  # fmt: skip
    print(f"  ITL mean         guidellm {client['itl_ms']:8.3f} ms   loadlens {server['itl_ms']:8.3f} ms "
          f"vllm {server['vllm_itl_ms']:8.3f} ms")  # fmt: skip
    print(f"  output tokens    guidellm {client['output_tokens']:8.0f}      server {server['output_tokens']:8.0f}")
    print(f"  prompt tokens    guidellm {client['prompt_tokens']:8.0f}      server {server['prompt_tokens']:8.0f}")
    print(f"  output tok/s     guidellm {client['output_tok_s']:8.1f}")
    ok = (
        client["output_tokens"] == server["output_tokens"]
        and client["prompt_tokens"] == server["prompt_tokens"]
        and abs(client["itl_ms"] - server["itl_ms"]) <= 0.05 * server["itl_ms"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
