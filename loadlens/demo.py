"""``make demo``: the whole local stack, a short stress test through it, and what it measured.

1. ``loadlens stack up``: Prometheus, Alertmanager, the simulated server (DeepSeek-VL-7B on an A100 40GB
   PCIe, the guide's setup, priority scheduling on), the GPU exporter and the pager, in ``.run/stack``.
2. One request streamed token by token, to show the server works.
3. ``loadlens load --profile quick`` (the guide's stress shape, compressed to about a minute and a half), with
   server-side figures from Prometheus.
   ``loadlens load`` prints the one per-stage table (TTFT, ITL, E2E percentiles, tok/s, goodput, peak VRAM,
   GPU utilisation mean and swing) and the run's verdict: pass/fail against every SLO, and the alerts that
   fired and the pages the pager received during the run's window (it waits, at most ``--alert-wait``, for
   alerts still pending when the load stopped, and for their pages). Pages of earlier runs never count.
4. ``loadlens report``: the dashboards' queries over the run's window, as one self-contained HTML page.
5. The verdict's headline again, where the results are and how to open Prometheus.

The stack stays up afterwards so Prometheus can be explored; ``loadlens stack down`` stops it. The demo
exits non-zero if the stack or the load run failed (a FAIL verdict is the demo's point, not a failure).
Environment: ``LOADLENS_DEMO_PROFILE`` (default ``quick``), ``LOADLENS_DEMO_TIME_SCALE`` (default 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from loadlens.contracts.results import ResultsError, parse_result
from loadlens.stack.runner import Stack, StackOptions
from loadlens.util.cliutil import UsageError
from loadlens.util.net import free_port

RUN_DIR = Path(".run/stack")
RESULTS = Path("results")
MODEL, GPU = "deepseek-vl-7b", "a100-40gb-pcie"


def say(text: str = "") -> None:
    print(text, flush=True)


def start_stack() -> tuple[Stack, dict[str, str]]:
    options = StackOptions(run_dir=RUN_DIR, model_profile=MODEL, gpu_profile=GPU)
    stack = Stack(options, say=say)
    stack.down()  # a stack left by an earlier demo: start fresh
    try:
        services = stack.up()
    except UsageError as err:
        if "ports in use" not in str(err):
            raise
        say(f"demo: {err}; using free ports instead")
        options = StackOptions(
            run_dir=RUN_DIR, model_profile=MODEL, gpu_profile=GPU, serve_port=free_port(), gpu_port=free_port(),
            pager_port=free_port(), loadgen_port=free_port(), prometheus_port=free_port(),
            alertmanager_port=free_port(),
        )  # fmt: skip
        stack = Stack(options, say=say)
        services = stack.up()
    urls = {s.name: s.url for s in services}
    urls["loadgen_port"] = str(options.loadgen_port)
    return stack, urls


def stream_one(url: str) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Explain continuous batching in one paragraph."}],
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
    }
    started = time.monotonic()
    first: float | None = None
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        method="POST",
    )
    # urlopen raises HTTPError for a non-2xx answer; its response yields the SSE lines as they arrive.
    with urllib.request.urlopen(request, timeout=60) as response:
        say("demo: one request, streamed token by token:")
        print("  ", end="")
        for raw in response:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.startswith("data: {"):
                continue
            text = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            if text and first is None:
                first = time.monotonic() - started
            print(text, end="", flush=True)
    say(
        f"\n   (first token after {first * 1000 if first else 0:.0f} ms, done after {time.monotonic() - started:.2f} s)"
    )


def load_command(
    urls: dict[str, str], run_id: str, profile: str, time_scale: str, *, pages: str, results: Path = RESULTS
) -> list[str]:
    """``loadlens load`` against the stack: server-side figures and alerts from its Prometheus, pages from the
    pager (``pages``: its URL, or its log file, which holds every earlier run's pages too), so the verdict
    covers the run's window and only it."""
    return [
        sys.executable, "-m", "loadlens.cli", "load", "--profile", profile, "--host", urls["serve"], "--headless",
        "--prometheus", urls["prometheus"], "--pager", pages, "--results", str(results),
        "--run-id", run_id, "--metrics-port", urls["loadgen_port"], "--time-scale", time_scale,
    ]  # fmt: skip


def run_load(urls: dict[str, str], run_id: str) -> int:
    profile = os.environ.get("LOADLENS_DEMO_PROFILE", "quick")
    time_scale = os.environ.get("LOADLENS_DEMO_TIME_SCALE", "1")
    # The pager's log, not its URL: it survives pager restarts, and it holds earlier demos' pages, which the
    # verdict leaves out (only alerts that started in this run's window count).
    cmd = load_command(urls, run_id, profile, time_scale, pages=str(RUN_DIR / "pages.jsonl"))
    say(f"\ndemo: running the '{profile}' profile: {' '.join(cmd[2:])}")
    return subprocess.call(cmd)


def verdict_headline(result_file: Path) -> str:
    """The run's verdict headline from its result file (computed by ``loadlens load``, never here)."""
    try:
        result = parse_result(json.loads(result_file.read_text(encoding="utf-8")), str(result_file))
    except (OSError, ValueError, ResultsError) as err:
        return f"no verdict: {err}"
    if result.verdict is None:
        return f"no verdict in {result_file}"
    return result.verdict.headline


def main() -> int:
    say("demo: starting the local stack (Prometheus, Alertmanager, sim server, GPU exporter, pager)")
    try:
        stack, urls = start_stack()
    except (UsageError, RuntimeError) as err:
        say(f"demo: the stack did not start: {err}")
        return 1
    say(f"demo: stack up; server {urls['serve']}, Prometheus {urls['prometheus']}")
    try:
        stream_one(urls["serve"])
    except OSError as err:  # URLError, HTTPError, a timeout or a reset
        say(f"demo: the server did not answer: {err}")
        stack.down()
        return 1
    run_id = "demo-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    rc = run_load(urls, run_id)
    result_file = RESULTS / run_id / "benchmark_result.json"
    if not result_file.exists():
        say(f"demo: no results at {result_file}")
    report_dir = RESULTS / run_id / "report"
    report_rc = 1
    if result_file.exists():
        say("\ndemo: rendering the report (the dashboards' queries over the run's window)")
        report_rc = subprocess.call(
            [sys.executable, "-m", "loadlens.cli", "report", "--prometheus", urls["prometheus"],
             "--results", str(result_file), "--out", str(report_dir)]
        )  # fmt: skip
    if result_file.exists():
        say(f"\nverdict: {verdict_headline(result_file)}")
    say("\nWhere things are:")
    say(f"  results       {result_file}")
    if report_rc == 0:
        say(f"  report        {report_dir / 'index.html'}")
    say(f"  Prometheus    {urls['prometheus']}/classic/graph (try gen_ai_server_time_to_first_token_seconds_bucket)")
    say(f"  Alertmanager  {urls['alertmanager']}/api/v2/alerts")
    say(f"  logs, configs {RUN_DIR}/")
    say("  stop it all   .venv/bin/loadlens stack down")
    if rc not in (0, 3):
        say(f"\ndemo: the load run failed (exit {rc})")
        return 1
    say("\ndemo: done." + (" (results marked invalid: the load generator was CPU-bound)" if rc == 3 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
