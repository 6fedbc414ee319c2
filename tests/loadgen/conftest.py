"""Fixtures for load-generator tests: a ground-truth server in a thread, Locust in child processes.

Locust runs only in subprocesses (its gevent monkey patching must never reach the pytest process). Every
child gets its own session so that on a timeout the whole group (CLI, Locust master, workers) is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from exporters.serving.app import ServeSettings, create_app
from exporters.serving.engine import GenerationRequest, RequestStream
from exporters.serving.tracing import Tracing
from tests.serving.fakes import ScriptedEngine
from tests.support.paths import ROOT
from tests.support.server import serve_app


class _Override:
    """The engine as one stream sees it, with another TTFT (the stream reads ``engine.ttft_s`` when it runs)."""

    def __init__(self, engine: ScriptedEngine, ttft_s: float) -> None:
        self._engine = engine
        self.ttft_s = ttft_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


class ColdStartEngine(ScriptedEngine):
    """The first ``cold_requests`` admitted requests have a slow first token: a cold start the warmup must hide."""

    def __init__(self, *, cold_requests: int = 0, cold_ttft_s: float = 0.3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cold_requests = cold_requests
        self.cold_ttft_s = cold_ttft_s
        self.admitted = 0

    async def generate(self, request: GenerationRequest) -> RequestStream:
        stream = await super().generate(request)
        self.admitted += 1
        if self.admitted <= self.cold_requests:
            stream.engine = _Override(self, self.cold_ttft_s)  # type: ignore[attr-defined]
        return stream


class HeaderRecorder:
    """ASGI middleware: remembers the ``traceparent`` of every generation request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.traceparents: list[str | None] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].endswith("completions"):
            raw = dict(scope["headers"]).get(b"traceparent")
            self.traceparents.append(raw.decode() if raw else None)
        await self.app(scope, receive, send)


@dataclass
class Served:
    url: str
    engine: ColdStartEngine
    registry: CollectorRegistry
    headers: HeaderRecorder

    def total(self, name: str) -> float:
        """Sum of a counter over all its label sets."""
        return sum(s.value for m in self.registry.collect() for s in m.samples if s.name == name)


@pytest.fixture
def scripted(request: pytest.FixtureRequest) -> Iterator[Served]:
    """ScriptedEngine behind the real HTTP layer; ``@pytest.mark.parametrize('scripted', [{...}], indirect=True)``."""
    params: dict[str, Any] = getattr(request, "param", {}) or {}
    engine = ColdStartEngine(**{"ttft_s": 0.05, "itl_s": 0.01, **params})
    registry = CollectorRegistry()
    app = HeaderRecorder(create_app(engine, ServeSettings(), registry=registry, tracing=Tracing.disabled()))
    with serve_app(app) as url:
        yield Served(url, engine, registry, app)


class WatchedEvent(threading.Event):
    """A real event that tells the test when a thread begins to wait on it, and for how long it means to."""

    def __init__(self, began: threading.Event, timeouts: list[float | None]) -> None:
        super().__init__()
        self.began = began
        self.timeouts = timeouts

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        self.began.set()
        return super().wait(timeout)


@dataclass
class EventWatch:
    """``new_event`` for ``StageDispatch``: every event it makes reports into ``began`` and ``timeouts``, so a
    test waits for a sender to be waiting instead of sleeping and hoping it got there."""

    began: threading.Event = field(default_factory=threading.Event)
    timeouts: list[float | None] = field(default_factory=list)

    def new_event(self) -> threading.Event:
        return WatchedEvent(self.began, self.timeouts)


def write_profile(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"version": 1, "name": "test", "stop_timeout_s": 5, **doc}))
    return path


def run_child(
    args: list[str], *, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a child in its own process group; kill the group if it outlives ``timeout``."""
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{' '.join(args[:6])} ... timed out after {timeout} s:\n{out[-4000:]}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(args, proc.returncode, out, "")


CPU_GUARD_OFF = ("--cpu-threshold", "1000")
"""The CPU guard marks a run invalid (exit 3) when the load generator's CPU passes 0.9 core; on a busy test
machine that verdict belongs to the neighbours, not to the code under test. 1000 cores: it never trips."""


def loadlens(*args: str) -> list[str]:
    """``loadlens load`` with ``args``; the CPU guard off unless the test sets ``--cpu-threshold`` itself."""
    guard = () if "--cpu-threshold" in args else CPU_GUARD_OFF
    return [sys.executable, "-m", "loadlens.cli", "load", *args, *guard]


def result_of(results: Path) -> dict[str, Any]:
    files = list(results.glob("*/benchmark_result.json"))
    assert len(files) == 1, files
    doc: dict[str, Any] = json.loads(files[0].read_text())
    return doc
