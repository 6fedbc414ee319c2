"""The local stack without Docker: child processes on 127.0.0.1 with generated configs in a run directory.

``up`` starts Prometheus and Alertmanager (system binaries), ``loadlens serve --engine sim``,
``loadlens gpu-exporter --backend sim`` and ``loadlens pager``, waits until each answers its readiness URL,
and records PIDs (with their start times, so a reused PID is never killed) in ``<run-dir>/stack.json``.
``down`` stops them by PID (SIGTERM, then SIGKILL after a grace period); ``status`` reports each one;
``restart NAME`` stops one and starts it again with the same command line and data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from loadlens.alerting.alertmanager import alertmanager_config
from loadlens.alerting.prometheus_config import prometheus_config
from loadlens.alerting.rule_file import render
from loadlens.alerting.rules import build_groups
from loadlens.contracts.ports import GPU_JOB, LOADGEN_JOB, PAGER_JOB, SERVE_JOB, TRAINING_JOB
from loadlens.contracts.slo import load_slos
from loadlens.util.cliutil import UsageError
from loadlens.util.http import http_ok
from loadlens.util.prometheus import PrometheusClient, PrometheusUnreachable, QueryError

STATE_FILE = "stack.json"
PROBE_DIR = "probe"  # under the run directory: where local in-process probes write (LOADLENS_PROBE_DIR)
INSTALL_HINT = "apt-get install prometheus prometheus-alertmanager (Debian/Ubuntu), or put the binaries on PATH"


@dataclass
class StackOptions:
    run_dir: Path
    serve_port: int = 8000
    gpu_port: int = 9400
    pager_port: int = 9095
    loadgen_port: int = 9646
    training_port: int = 9647  # a training run (make train-demo) scraped when one runs
    prometheus_port: int = 19090
    alertmanager_port: int = 19093
    model_profile: str = "deepseek-vl-7b"
    gpu_profile: str = "a100-40gb-pcie"
    speed: float = 1.0
    knobs: list[str] = field(default_factory=lambda: ["scheduling_policy=priority"])
    slo_file: Path | None = None
    scrape_interval: str = "2s"
    startup_timeout_s: float = 30.0


@dataclass
class Service:
    name: str
    argv: list[str]
    port: int
    ready_url: str
    url: str
    pid: int = 0
    start_time: str = ""

    @property
    def log(self) -> str:
        return f"{self.name}.log"


def _proc_start_time(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks): identifies a process across PID reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(service: Service) -> bool:
    return service.pid > 0 and _proc_start_time(service.pid) == service.start_time != ""


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise UsageError(f"{names[0]} not found on PATH: {INSTALL_HINT}")


class Stack:
    def __init__(self, options: StackOptions, say: Callable[[str], None] = print) -> None:
        self.o = options
        self.say = say
        self.run_dir = options.run_dir.resolve()

    # --- configuration ----------------------------------------------------------------------------------

    def plan(self) -> list[Service]:
        o, py, d = self.o, sys.executable, self.run_dir
        prometheus = _binary("prometheus")
        alertmanager = _binary("prometheus-alertmanager", "alertmanager")
        serve = [
            py, "-m", "loadlens.cli", "serve", "--engine", "sim", "--host", "127.0.0.1",
            "--port", str(o.serve_port), "--model-profile", o.model_profile, "--gpu-profile", o.gpu_profile,
            "--speed", str(o.speed), "--enable-mfu-metrics",
        ]  # fmt: skip
        for knob in o.knobs:
            serve += ["--knob", knob]
        if o.slo_file is not None:
            serve += ["--slo-file", str(o.slo_file.resolve())]
        base = "http://127.0.0.1"
        return [
            Service("pager", [py, "-m", "loadlens.cli", "pager", "--port", str(o.pager_port),
                              "--log-file", str(d / "pages.jsonl")],
                    o.pager_port, f"{base}:{o.pager_port}/health", f"{base}:{o.pager_port}"),
            Service("alertmanager", [alertmanager, f"--config.file={d / 'alertmanager.yml'}",
                                     f"--storage.path={d / 'alertmanager-data'}",
                                     f"--web.listen-address=127.0.0.1:{o.alertmanager_port}",
                                     # links in notifications and the UI: what a browser here can open
                                     f"--web.external-url={base}:{o.alertmanager_port}",
                                     "--cluster.listen-address="],
                    o.alertmanager_port, f"{base}:{o.alertmanager_port}/-/ready", f"{base}:{o.alertmanager_port}"),
            Service("serve", serve, o.serve_port, f"{base}:{o.serve_port}/health", f"{base}:{o.serve_port}"),
            # --probe-dir: in-process probes of local GPU processes (a trainer with LOADLENS_PROBE_DIR set to
            # it) publish their allocator documents there (docs/probe-documents.md).
            Service("gpu-exporter", [py, "-m", "loadlens.cli", "gpu-exporter", "--backend", "sim",
                                     "--sim-url", f"{base}:{o.serve_port}/sim/device-state",
                                     "--probe-dir", str(d / PROBE_DIR),
                                     "--host", "127.0.0.1", "--port", str(o.gpu_port)],
                    o.gpu_port, f"{base}:{o.gpu_port}/health", f"{base}:{o.gpu_port}"),
            Service("prometheus", [prometheus, f"--config.file={d / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={d / 'prometheus-data'}",
                                   f"--web.listen-address=127.0.0.1:{o.prometheus_port}",
                                   # alerts' generatorURL (the "source" link in Alertmanager and pages)
                                   f"--web.external-url={base}:{o.prometheus_port}",
                                   "--enable-feature=exemplar-storage", "--web.enable-lifecycle",
                                   # resend quickly: the first notification is dropped before discovery
                                   "--rules.alert.resend-delay=1s"],
                    o.prometheus_port, f"{base}:{o.prometheus_port}/-/ready", f"{base}:{o.prometheus_port}"),
        ]  # fmt: skip

    def write_configs(self) -> None:
        o, d = self.o, self.run_dir
        d.mkdir(parents=True, exist_ok=True)
        slos = load_slos(o.slo_file)
        if slos.alerting.get("runbook_base_url") == load_slos().alerting.get("runbook_base_url"):
            # The packaged default names the pager's default port; point it at this stack's pager.
            alerting = {**slos.alerting, "runbook_base_url": f"http://127.0.0.1:{o.pager_port}/runbooks"}
            slos = dataclasses.replace(slos, alerting=alerting)
        recording, alerts = build_groups(slos)
        (d / "rules").mkdir(exist_ok=True)
        (d / PROBE_DIR).mkdir(exist_ok=True)
        (d / "rules" / "loadlens-rules.yaml").write_text(render({"groups": recording}))
        (d / "rules" / "loadlens-alerts.yaml").write_text(render({"groups": alerts}))
        am = alertmanager_config(f"http://127.0.0.1:{o.pager_port}/alerts")
        # Short waits locally: a load-test stage lasts minutes, not hours.
        am["route"]["group_wait"] = "1s"
        am["route"]["group_interval"] = "5s"
        (d / "alertmanager.yml").write_text(yaml.safe_dump(am, sort_keys=False))
        prom = prometheus_config(
            {
                SERVE_JOB: [f"127.0.0.1:{o.serve_port}"],
                GPU_JOB: [f"127.0.0.1:{o.gpu_port}"],
                LOADGEN_JOB: [f"127.0.0.1:{o.loadgen_port}"],
                TRAINING_JOB: [f"127.0.0.1:{o.training_port}"],
                PAGER_JOB: [f"127.0.0.1:{o.pager_port}"],
            },
            rule_files=[str(d / "rules" / "*.yaml")],
            alertmanagers=[f"127.0.0.1:{o.alertmanager_port}"],
            scrape_interval=o.scrape_interval,
            evaluation_interval=o.scrape_interval,
        )
        (d / "prometheus.yml").write_text(yaml.safe_dump(prom, sort_keys=False))

    # --- state ------------------------------------------------------------------------------------------

    def _load(self) -> list[Service]:
        path = self.run_dir / STATE_FILE
        if not path.exists():
            return []
        doc = json.loads(path.read_text())
        return [Service(**s) for s in doc.get("services", [])]

    def _save(self, services: Sequence[Service]) -> None:
        doc: dict[str, Any] = {"started_at": time.time(), "services": [asdict(s) for s in services]}
        (self.run_dir / STATE_FILE).write_text(json.dumps(doc, indent=2))

    # --- verbs ------------------------------------------------------------------------------------------

    def up(self) -> list[Service]:
        running = [s for s in self._load() if _alive(s)]
        if running:
            names = ", ".join(f"{s.name} (pid {s.pid})" for s in running)
            raise UsageError(f"a stack is already running from {self.run_dir}: {names}; run `loadlens stack down`")
        services = self.plan()
        busy = [f"{s.name} port {s.port}" for s in services if not _port_free(s.port)]
        if busy:
            raise UsageError(f"ports in use: {', '.join(busy)}; choose others with the --*-port flags")
        self.write_configs()
        started: list[Service] = []
        try:
            for service in services:
                self.say(f"  starting {service.name:<13} {service.url}")
                proc = self._spawn(service)
                started.append(service)
                self._save(started)
                self._wait_ready(service, proc)
        except BaseException:
            self.say("  start failed; stopping what was started")
            self._stop(started)
            raise
        return started

    def _spawn(self, service: Service) -> subprocess.Popen[bytes]:
        log = open(self.run_dir / service.log, "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            service.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.run_dir
        )
        log.close()
        service.pid = proc.pid
        service.start_time = _proc_start_time(proc.pid)
        return proc

    def restart(self, name: str) -> Service:
        """Stop one service (SIGTERM, as an operator or a node drain would) and start it again with the same
        command line, configs and data directory; waits until it is ready again."""
        services = self._load()
        service = next((s for s in services if s.name == name), None)
        if service is None:
            known = ", ".join(s.name for s in services) or "none (the stack is not running)"
            raise UsageError(f"no service {name!r} in {self.run_dir / STATE_FILE}; services: {known}")
        self._stop([service])
        proc = self._spawn(service)
        self._save(services)
        self._wait_ready(service, proc)
        return service

    def _wait_ready(self, service: Service, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.o.startup_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{service.name} exited with {proc.returncode}:\n{self._tail(service)}")
            if http_ok(service.ready_url):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{service.name} not ready after {self.o.startup_timeout_s:.0f} s:\n{self._tail(service)}")

    def _tail(self, service: Service, lines: int = 15) -> str:
        path = self.run_dir / service.log
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join("    " + line for line in text.splitlines()[-lines:])

    def _stop(self, services: Sequence[Service], grace_s: float = 10.0) -> list[str]:
        stopped = []
        for service in reversed(services):
            if not _alive(service):
                continue
            self.say(f"  stopping {service.name:<13} pid {service.pid}")
            try:
                os.kill(service.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + grace_s
            while _alive(service) and time.monotonic() < deadline:
                time.sleep(0.05)
                with contextlib.suppress(ChildProcessError):  # reap our own children: no zombies
                    os.waitpid(service.pid, os.WNOHANG)
            if _alive(service):
                os.kill(service.pid, signal.SIGKILL)
            stopped.append(service.name)
        return stopped

    def down(self) -> list[str]:
        services = self._load()
        stopped = self._stop(services)
        state = self.run_dir / STATE_FILE
        if state.exists():
            state.unlink()
        return stopped

    def ui_links(self) -> list[tuple[str, str]]:
        """(what, URL) of the pages worth opening, with the paths this Prometheus serves: Debian's build has
        only the classic UI (``/classic/graph``; ``/graph`` and ``/alerts`` answer 404), upstream's both."""
        urls = {s.name: s.url for s in self._load()}
        links: list[tuple[str, str]] = []
        prom = urls.get("prometheus")
        if prom is not None:
            classic = not http_ok(prom + "/alerts") and http_ok(prom + "/classic/alerts")
            prefix = prom + ("/classic" if classic else "")
            links += [("Prometheus graph", prefix + "/graph"), ("Prometheus alerts", prefix + "/alerts")]
        if "alertmanager" in urls:
            links.append(("Alertmanager", urls["alertmanager"] + "/#/alerts"))
        if "pager" in urls:
            links += [("Runbooks", urls["pager"] + "/runbooks"), ("Pages received", urls["pager"] + "/pages")]
        return links

    def alerts_and_pages(self) -> tuple[list[str] | None, int, float | None]:
        """The alerts Prometheus has firing now (``name{severity}``, sorted; None when it cannot be asked), the
        pager's notifications in this run directory, and the Unix time of the last one."""
        urls = {s.name: s.url for s in self._load()}
        firing: list[str] | None = None
        if "prometheus" in urls:
            try:
                groups = PrometheusClient(urls["prometheus"], timeout=3.0).rule_groups()
            except (PrometheusUnreachable, QueryError):
                groups = None
            if groups is not None:
                firing = sorted(
                    f"{a['labels'].get('alertname', '?')}{{{a['labels'].get('severity', '')}}}"
                    for g in groups
                    for r in g.get("rules", [])
                    for a in r.get("alerts", [])
                    if a.get("state") == "firing"
                )
        count, last = 0, None
        log = self.run_dir / "pages.jsonl"
        if log.exists():
            for line in log.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    last = float(json.loads(line)["received_at"])
                    count += 1
        return firing, count, last

    def status(self) -> list[tuple[Service, bool, bool]]:
        """(service, process alive, ready URL answers) for each recorded service."""
        return [(s, _alive(s), _alive(s) and http_ok(s.ready_url)) for s in self._load()]
