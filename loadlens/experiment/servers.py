"""How a trial's server configuration is applied: one class per mode, over one base (style R18).

- :class:`SimServer`: ``loadlens serve --engine sim`` started once as a child; knobs through its admin API.
- :class:`AdminServer`: a running server with ``PATCH /admin/knobs`` (``--host``).
- :class:`CommandServer`: a server (re)started per trial from a command template filled with the trial's
  knobs (``vllm serve ... --max-num-seqs {max_num_seqs}``), waited for until healthy, stopped after.
- per-trial URLs: a trial's ``host`` overrides the target; its knobs (if any) go through that host's admin API.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from loadlens.experiment.adapters import AdapterBook, AdapterLoadError
from loadlens.experiment.models import PlannedTrial, Scalar, template_fields
from loadlens.experiment.models import SimServer as SimSpec
from loadlens.util.child import stop_process_group
from loadlens.util.http import http_ok
from loadlens.util.net import free_port


class ServerError(RuntimeError):
    """The server could not be configured, started or reached; the message says which and why."""


def _request(method: str, url: str, body: Any = None, token: str | None = None, timeout: float = 10.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:300]
        raise ServerError(f"{method} {url}: HTTP {err.code}: {detail}") from err
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ServerError(f"{method} {url}: {err}") from err


class ServerControl:
    """Base: ``check(trials)`` before anything runs, ``prepare(trial)`` returns the trial's base URL,
    ``finish(trial)`` after it, ``close()`` at the end (also after an interrupt)."""

    mode = "admin"

    def __init__(self, url: str | None, token: str | None = None) -> None:
        self.url = url
        self.token = token
        self._original: dict[str, dict[str, Any]] = {}
        self.adapters: AdapterBook | None = None
        """The experiment's adapters: a trial's are loaded in :meth:`prepare`, unloaded in :meth:`finish`."""
        self.warnings: list[str] = []
        """What went wrong after a run without spoiling it (the runner prints and clears them)."""

    def describe(self) -> dict[str, Any]:
        return {"mode": self.mode, "target": self.url}

    def start(self) -> None:
        """Bring the server up (sim child) before the checks."""

    def _target(self, trial: PlannedTrial) -> str:
        url = trial.host or self.url
        if url is None:
            raise ServerError(f"trial {trial.name}: no target (give --host or the trial's host)")
        return url.rstrip("/")

    def knobs(self, url: str) -> dict[str, Any]:
        doc = _request("GET", f"{url}/admin/knobs", token=self.token)
        knobs = doc.get("knobs") if isinstance(doc, dict) else None
        if not isinstance(knobs, dict):
            raise ServerError(f"GET {url}/admin/knobs: no 'knobs' object in the answer")
        return knobs

    def check(self, trials: list[PlannedTrial]) -> None:
        """Every knob a trial sets exists on its server (one GET per server)."""
        seen: dict[str, dict[str, Any]] = {}
        for t in trials:
            if not t.knobs:
                continue
            url = self._target(t)
            if url not in seen:
                seen[url] = self.knobs(url)
                self._original[url] = dict(seen[url])
            unknown = sorted(set(t.knobs) - set(seen[url]))
            if unknown:
                has = ", ".join(sorted(seen[url]))
                raise ServerError(
                    f"trial {t.name}: knob {unknown[0]!r} does not exist on {url} (it has {has});"
                    " name the server's knob with --param"
                )

    def prepare(self, trial: PlannedTrial) -> str:
        url = self._target(trial)
        if trial.knobs:
            _request("PATCH", f"{url}/admin/knobs", body=dict(trial.knobs), token=self.token)
        self.load_adapters(url, trial)
        return url

    def load_adapters(self, url: str, trial: PlannedTrial) -> None:
        if self.adapters is None or not trial.adapters:
            return
        try:
            self.adapters.load(url, trial.adapters, self.token)
        except AdapterLoadError as err:
            raise ServerError(f"trial {trial.name}: loading its adapters: {err}") from err

    def finish(self, trial: PlannedTrial) -> None:
        self.unload_adapters(trial)

    def unload_adapters(self, trial: PlannedTrial) -> None:
        """A failed unload keeps the run that just finished; it is told in :attr:`warnings` (the next trial
        that loads the adapter then fails with the server's reason)."""
        if self.adapters is None or not trial.adapters:
            return
        try:
            self.adapters.unload(self._target(trial), trial.adapters, self.token)
        except AdapterLoadError as err:
            self.warnings.append(f"trial {trial.name}: unloading its adapters: {err}")

    def close(self) -> None:
        """Put back the knobs the experiment changed and unload the adapters it left loaded."""
        if self.adapters is not None:
            for url, names in list(self.adapters.loaded.items()):
                with _suppress():
                    try:
                        self.adapters.unload(url, tuple(sorted(names)), self.token)
                    except AdapterLoadError as err:
                        raise ServerError(str(err)) from err
        for url, original in self._original.items():
            with _suppress():
                current = self.knobs(url)
                changed = {k: v for k, v in original.items() if current.get(k) != v and k != "num_gpu_blocks"}
                if changed:
                    _request("PATCH", f"{url}/admin/knobs", body=changed, token=self.token)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], ServerError)  # type: ignore[arg-type]


class AdminServer(ServerControl):
    mode = "admin"


class UrlServer(ServerControl):
    mode = "urls"


class _Child:
    """A server process in its own process group, stopped with SIGTERM then SIGKILL."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        self._out = log.open("ab")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def wait_healthy(self, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not http_ok(url):
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-600:].strip().replace("\n", " | ")
                raise ServerError(f"server exited with {self.proc.returncode} before {url} answered: {tail}")
            if time.monotonic() > deadline:
                raise ServerError(f"server did not answer {url} within {timeout_s:.0f} s (log: {self.log})")
            time.sleep(0.1)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the whole group, then SIGKILL to whatever of it is left after ``grace_s``, even when the
        leader already exited: a server's children (vLLM's ``EngineCore`` and workers) can outlive it and
        would hold the memory and answer the next trial."""
        stop_process_group(self.proc, grace_s)
        self._out.close()


class SimServer(ServerControl):
    """The sim as a child of the experiment, on a free port, configured as the experiment's ``sim`` says."""

    mode = "sim"

    def __init__(self, spec: SimSpec, log: Path, speed: float | None = None, lora_root: Path | None = None) -> None:
        super().__init__(None)
        port = free_port()
        self.argv = [
            sys.executable,
            "-m",
            "loadlens.cli",
            "serve",
            "--engine",
            "sim",
            "--model-profile",
            spec.model_profile,
            "--gpu-profile",
            spec.gpu_profile,
            "--speed",
            str(speed if speed is not None else spec.speed),
            "--seed",
            str(spec.seed),
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        for key, value in spec.knobs.items():
            self.argv += ["--knob", f"{key}={_knob_text(value)}"]
        self.lora_root = lora_root
        if lora_root is not None:
            self.argv += ["--lora-root", str(lora_root)]
        self.url = f"http://127.0.0.1:{port}"
        self._log = log
        self._child: _Child | None = None

    def describe(self) -> dict[str, Any]:
        return {"mode": self.mode, "target": self.url, "sim_argv": self.argv[2:]}

    def start(self) -> None:
        if self.lora_root is not None:
            self.lora_root.mkdir(parents=True, exist_ok=True)
        self._child = _Child(self.argv, self._log)
        self._child.wait_healthy(f"{self.url}/health", 60.0)

    def close(self) -> None:
        if self._child is not None:
            self._child.stop()
            self._child = None


def _knob_text(value: Scalar) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


class CommandServer(ServerControl):
    """Per trial: fill the template with the trial's knobs, start it, wait for ``url + health_path``, stop it
    after the trial."""

    mode = "command"

    def __init__(self, template: str, url: str, log_dir: Path, health_path: str = "/health", timeout_s: float = 600.0):
        super().__init__(url)
        self.template = template
        self.health_path = health_path
        self.timeout_s = timeout_s
        self.log_dir = log_dir
        self._child: _Child | None = None

    def describe(self) -> dict[str, Any]:
        return {"mode": self.mode, "target": self.url, "command": self.template}

    LORA_MODULES = "lora_modules"
    """The template field filled with the trial's adapters as vLLM's ``--lora-modules`` value."""

    def command(self, trial: PlannedTrial) -> list[str]:
        values = {k: _knob_text(v) for k, v in trial.knobs.items()}
        if self.LORA_MODULES in template_fields(self.template) and self.LORA_MODULES not in values:
            if not trial.adapters or self.adapters is None:
                raise ServerError(
                    f"--server-command: trial {trial.name} loads no adapters for the template's {{lora_modules}}"
                )
            values[self.LORA_MODULES] = self.adapters.lora_modules(trial.adapters)
        missing = [f for f in template_fields(self.template) if f not in values]
        if missing:
            raise ServerError(
                f"--server-command: trial {trial.name} has no knob {missing[0]!r} for the template "
                f"(its knobs: {', '.join(sorted(values)) or 'none'})"
            )
        return shlex.split(self.template.format(**values))

    def check(self, trials: list[PlannedTrial]) -> None:
        for t in trials:
            self.command(t)

    def prepare(self, trial: PlannedTrial) -> str:
        url = self._target(trial)
        if http_ok(url + self.health_path):
            # The trial would measure that server (the previous trial's, if its stop failed), not its own.
            raise ServerError(f"trial {trial.name}: {url + self.health_path} answers before its server started")
        self._child = _Child(self.command(trial), self.log_dir / trial.name / "server.log")
        self._child.wait_healthy(url + self.health_path, self.timeout_s)
        if self.LORA_MODULES not in template_fields(self.template):
            self.load_adapters(url, trial)
        return url

    def finish(self, trial: PlannedTrial) -> None:
        # The server goes away with whatever it had loaded: nothing to unload.
        if self._child is not None:
            self._child.stop()
            self._child = None
        if self.adapters is not None and self.url is not None:
            self.adapters.forget(self.url.rstrip("/"))

    def close(self) -> None:
        self.finish(None)  # type: ignore[arg-type]
