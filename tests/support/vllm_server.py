"""One real vLLM (its CPU build, from ``.venv-vllm``) serving the tiny model, as a plain context manager.

    with vllm_server(tiny_model(), log_path=Path("vllm.log")) as server:
        ...   # server.url == "http://127.0.0.1:<port>"; the whole process group is killed on exit

The tests wrap it in one session fixture (tests/vllm/conftest.py); benchmarks and experiments call it or take
``vllm_argv`` as their server command. vLLM runs in its own process group because its API server does not
always pass SIGTERM on to its ``EngineCore``/``Worker`` children: the group is killed, not the leader. Its output
goes to a log file, whose tail every failure to start carries (docs/real-vllm.md).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from loadlens.util.child import stop_process_group
from loadlens.util.http import http_ok
from loadlens.util.net import free_port
from tests.support.paths import ROOT
from tests.support.vllm_model import SERVED_NAME, TinyModel

VENV_ENV = "LOADLENS_VLLM_VENV"
"""Where vLLM's environment is (default ``.venv-vllm`` in the checkout; `make vllm-env` makes it)."""
MAX_MODEL_LEN = 1024
SCHEDULER_LIMITS: dict[str, int] = {"max_num_seqs": 128, "max_num_batched_tokens": 2048}
"""The rig's scheduler limits: the rig sets neither, so vLLM 0.32's CPU-build API-server defaults
(tests/vllm/test_batch_defaults.py reads them from vLLM); vLLM does not export them, so calibrate is told."""
ENV: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache: ample for 1,024-token sequences of this model
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",  # /v1/load_lora_adapter and /v1/unload_lora_adapter
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",  # everything is on disk; a lookup on the Hub would be a bug
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


LORA_LOG_LOGGER = "vllm.lora.model_manager"
"""vLLM's logger that writes, at DEBUG, one line per adapter put into a GPU slot (``Activating LoRA. int id:
N, slot index: I``) and per adapter read into its cache (``Adding lora. Model id: N, ...``)."""


def lora_logging_config(path: Path) -> dict[str, str]:
    """Write a vLLM logging configuration (``VLLM_LOGGING_CONFIG_PATH``) to ``path``: vLLM's loggers at INFO to
    stdout, ``LORA_LOG_LOGGER`` at DEBUG, so vLLM's own log says which adapter loads it did; returns the env."""
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "plain": {"format": "%(levelname)s %(asctime)s [%(name)s pid=%(process)d] %(message)s"},
        },
        "handlers": {
            "vllm": {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stdout"},
        },
        "loggers": {
            "vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False},
            LORA_LOG_LOGGER: {"level": "DEBUG"},
        },
    }
    path.write_text(json.dumps(config, indent=1))
    return {"VLLM_LOGGING_CONFIG_PATH": str(path)}


_LORA_LINE = re.compile(
    r"\[" + re.escape(LORA_LOG_LOGGER) + r" pid=\d+\] (?:Adding lora\. Model id: (\d+)|Activating LoRA\. int id: (\d+))"
)


def lora_slot_fills(log_text: str) -> list[tuple[int, str]]:
    """Every adapter vLLM put into a GPU slot, in order, from its log under ``lora_logging_config``:
    ``(lora int id, "storage")`` when vLLM read it into its cache just before (``Adding lora``), else
    ``(lora int id, "cpu_cache")``."""
    fills: list[tuple[int, str]] = []
    added: int | None = None
    for match in _LORA_LINE.finditer(log_text):
        if match.group(1) is not None:
            added = int(match.group(1))
            continue
        lora_id = int(match.group(2))
        fills.append((lora_id, "storage" if added == lora_id else "cpu_cache"))
        added = None
    return fills


@contextlib.contextmanager
def adapters_unloaded(client: httpx.Client, names: Sequence[str]) -> Iterator[None]:
    """Unload the adapters ``names`` through ``client`` (vLLM or a proxy in front of it) when the block ends: a
    session's vLLM lists its adapters to every later test."""
    try:
        yield
    finally:
        for name in names:
            client.post("/v1/unload_lora_adapter", json={"lora_name": name})


class VllmStartError(RuntimeError):
    """vLLM exited or never became healthy; the message ends with its log's tail."""


@dataclass(frozen=True)
class VllmServer:
    url: str
    """``http://127.0.0.1:<port>``"""
    pid: int
    """The API server's pid, which is its process group's id too."""
    log_path: Path
    model: TinyModel
    startup_s: float
    """Seconds from the start of the process to the first healthy answer."""
    served_name: str = SERVED_NAME

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)


def venv() -> Path:
    return Path(os.environ.get(VENV_ENV) or ROOT / ".venv-vllm")


def python() -> Path | None:
    """vLLM's interpreter, or None where `make vllm-env` has not run."""
    exe = venv() / "bin" / "python"
    return exe if exe.exists() else None


def vllm_argv(
    model: TinyModel,
    port: int,
    *,
    interpreter: Path | None = None,
    max_loras: int = 1,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command that serves ``model`` with LoRA on ``port``: vLLM's API server module, because the
    distribution is named ``vllm-cpu`` and its ``vllm`` console script looks for ``vllm``."""
    return [
        str(interpreter or python() or venv() / "bin" / "python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model.path),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--dtype",
        "bfloat16",
        "--enable-lora",
        "--max-lora-rank",
        str(max(model.ranks, default=8)),
        "--max-loras",
        str(max_loras),
        *extra_args,
    ]


def server_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """vLLM's environment: this one, ``ENV``, ``extra``, and this checkout first on ``PYTHONPATH``, so the code
    vLLM runs in its processes (loadlens's plugin and probe) is the checkout's, whatever loadlens
    ``.venv-vllm`` has installed (an editable install points at the checkout that made it)."""
    merged = {**os.environ, **ENV, **(extra or {})}
    merged["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), merged.get("PYTHONPATH", "")) if p)
    return merged


def runtime_dir(port: int) -> Path:
    """An empty directory for the files vLLM leaves in the temporary directory (its ZMQ ``ipc://`` sockets and
    ``vllm_dist_*`` init files, which a killed vLLM never removes: two a start, thousands over a day of tests),
    one per port, emptied when a vLLM starts on that port and removed when ``vllm_server`` stops it."""
    path = Path(tempfile.gettempdir()) / f"loadlens-vllm-{port}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    return path


def runtime_env(path: Path) -> dict[str, str]:
    """The variables that send vLLM's temporary files to ``path`` (``TMPDIR``, ``VLLM_RPC_BASE_PATH``), with
    PyTorch's compile cache kept where it was (under the real temporary directory, or ``TORCHINDUCTOR_CACHE_DIR``
    where set), so that a start does not recompile what the last one compiled."""
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")
    return {"TMPDIR": str(path), "VLLM_RPC_BASE_PATH": str(path), "TORCHINDUCTOR_CACHE_DIR": inductor}


def log_tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def vllm_server(
    model: TinyModel,
    *,
    log_path: Path,
    port: int | None = None,
    interpreter: Path | None = None,
    max_loras: int = 1,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout_s: float = 300.0,
    stop_grace_s: float = 10.0,
) -> Iterator[VllmServer]:
    """Start vLLM (``server_env(env)``: ``ENV``, ``env``, the checkout first on ``PYTHONPATH``), wait until
    ``/health`` answers 200,
    yield it, kill its process group on exit."""
    port = port or free_port()
    argv = vllm_argv(model, port, interpreter=interpreter, max_loras=max_loras, extra_args=extra_args)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    runtime = runtime_dir(port)
    started = time.monotonic()
    with log_path.open("wb") as log:
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=server_env({**runtime_env(runtime), **(env or {})}),
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = started + timeout_s
        while not http_ok(url + "/health"):
            if proc.poll() is not None:
                raise VllmStartError(f"vLLM exited with {proc.returncode}; {log_path}:\n{log_tail(log_path)}")
            if time.monotonic() > deadline:
                raise VllmStartError(f"vLLM not healthy within {timeout_s:.0f} s; {log_path}:\n{log_tail(log_path)}")
            time.sleep(0.25)
        yield VllmServer(url, proc.pid, log_path, model, time.monotonic() - started)
    finally:
        stop_process_group(proc, stop_grace_s)
        shutil.rmtree(runtime, ignore_errors=True)
