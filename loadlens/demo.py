"""``make demo``: the whole local stack, a short stress test through it, and what it measured.

1. ``loadlens stack up``: Prometheus, Alertmanager, the simulated server (DeepSeek-VL-7B on an A100 40GB
   PCIe, the guide's setup, priority scheduling on), the GPU exporter and the pager, in ``.run/stack``.
2. One request streamed token by token, to show the server works.
3. ``loadlens load --profile quick`` (the guide's stress shape, compressed to about a minute and a half), with
   server-side figures from Prometheus.
4. A summary: the per-stage table (TTFT p50/p99, ITL p99, tok/s, peak VRAM, GPU utilisation mean and swing),
   alerts that fired, pages the pager received, where the results are and how to open Prometheus.
5. ``loadlens report``: the dashboards' queries over the run's window, as one self-contained HTML page.

The stack stays up afterwards so Prometheus can be explored; ``loadlens stack down`` stops it. The demo
exits non-zero if the stack or the load run failed. Environment: ``LOADLENS_DEMO_PROFILE`` (default
``quick``), ``LOADLENS_DEMO_TIME_SCALE`` (default 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

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


def run_load(urls: dict[str, str], run_id: str) -> int:
    profile = os.environ.get("LOADLENS_DEMO_PROFILE", "quick")
    cmd = [
        sys.executable, "-m", "loadlens.cli", "load", "--profile", profile, "--host", urls["serve"], "--headless",
        "--prometheus", urls["prometheus"], "--results", str(RESULTS), "--run-id", run_id,
        "--metrics-port", urls["loadgen_port"], "--time-scale", os.environ.get("LOADLENS_DEMO_TIME_SCALE", "1"),
    ]  # fmt: skip
    say(f"\ndemo: running the '{profile}' profile: {' '.join(cmd[2:])}")
    return subprocess.call(cmd)


def fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_stages(result: dict[str, Any]) -> None:
    say("\nPer stage (client view; server view from Prometheus):")
    head = ("stage", "users", "ok", "fail", "TTFT p50", "TTFT p99", "ITL p99", "out tok/s", "goodput", "VRAM GiB",
            "GPU util", "swing")  # fmt: skip
    widths = (16, 5, 5, 4, 9, 9, 8, 9, 8, 8, 8, 6)
    say("  " + " ".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True)))
    say("  " + " ".join("-" * w for w in widths))
    for stage in result.get("stages", []):
        server = stage.get("server") or {}
        util, swing = server.get("mean_gpu_utilization_ratio"), server.get("gpu_utilization_peak_to_trough_ratio")
        name = stage["name"] + (" (warmup)" if stage.get("warmup") else "")
        cells = [
            name[:16], fmt(stage.get("target_users"), "d") if stage.get("target_users") is not None else "-",
            str(stage.get("completed", 0)), str(stage.get("failed", 0)),
            fmt(stage.get("p50_ttft_ms")), fmt(stage.get("p99_ttft_ms")), fmt(stage.get("p99_itl_ms")),
            fmt(stage.get("output_throughput"), ".0f"), fmt(stage.get("goodput_ratio"), ".0%"),
            fmt(server.get("peak_vram_gib"), ".2f"),
            "-" if util is None else f"{util:.0%}", "-" if swing is None else f"{swing:.0%}",
        ]  # fmt: skip
        say("  " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)))
    validity = result.get("validity", {})
    if not validity.get("results_valid", True):
        say(f"  results INVALID: {'; '.join(validity.get('reasons', []))}")
    say("  (latencies in ms; goodput = share of requests meeting every SLO of their class)")


def _pages() -> list[dict[str, Any]]:
    pages_file = RUN_DIR / "pages.jsonl"
    return [json.loads(line) for line in pages_file.read_text().splitlines()] if pages_file.exists() else []


def print_alerts(urls: dict[str, str]) -> None:
    try:
        with urllib.request.urlopen(urls["alertmanager"] + "/api/v2/alerts", timeout=5) as response:
            alerts = json.loads(response.read())
    except (OSError, ValueError) as err:  # URLError and HTTPError are OSErrors
        say(f"\nAlerts: Alertmanager did not answer ({err})")
        alerts = []
    # A page follows its alert by Alertmanager's group wait (5 s for critical): give it that long.
    deadline = time.monotonic() + 15
    critical = {a["labels"]["alertname"] for a in alerts if a["labels"].get("severity") == "critical"}
    while time.monotonic() < deadline:
        paged = {x["labels"].get("alertname") for n in _pages() for x in n["alerts"]}
        if critical <= paged:
            break
        time.sleep(0.5)
    say("\nAlerts active in Alertmanager:" if alerts else "\nAlerts active in Alertmanager: none")
    for a in alerts:
        labels = a["labels"]
        say(f"  {labels.get('severity', '?'):<8} {labels['alertname']:<34} {a['status']['state']:<10} "
            f"{a['annotations'].get('summary', '')}")  # fmt: skip
    notifications = _pages()
    received = sum(len(n["alerts"]) for n in notifications)
    say(f"Pages received by the pager: {received} alerts in {len(notifications)} notifications")
    for n in notifications[-10:]:
        for a in n["alerts"]:
            say(f"  {n['receiver']:<7} {a['status']:<9} {a['labels'].get('alertname')}")


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
    if result_file.exists():
        print_stages(json.loads(result_file.read_text()))
    else:
        say(f"demo: no results at {result_file}")
    print_alerts(urls)
    report_dir = RESULTS / run_id / "report"
    report_rc = 1
    if result_file.exists():
        say("\ndemo: rendering the report (the dashboards' queries over the run's window)")
        report_rc = subprocess.call(
            [sys.executable, "-m", "loadlens.cli", "report", "--prometheus", urls["prometheus"],
             "--results", str(result_file), "--out", str(report_dir)]
        )  # fmt: skip
    say("\nWhere things are:")
    say(f"  results       {result_file}")
    if report_rc == 0:
        say(f"  report        {report_dir / 'report.html'}")
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
