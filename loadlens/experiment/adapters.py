"""An experiment's LoRA adapters: written once with ``loadlens lora make`` into ``EXPDIR/adapters/NAME`` before
anything runs, then loaded onto a trial's server before its runs and unloaded after it.

Loading goes through the OpenAI-compatible server's runtime endpoints, the ones vLLM has
(``POST /v1/load_lora_adapter {lora_name, lora_path}``, ``POST /v1/unload_lora_adapter {lora_name}``; vLLM
needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), the sim has (paths inside its ``--lora-root``) and the proxy
forwards. A server started per trial from a ``--server-command`` template with a ``{lora_modules}`` field gets
them at start-up instead (``name=path`` pairs, vLLM's ``--lora-modules``).

Usage::

    book = AdapterBook(planned, exp_dir / "adapters", server_dir=None)
    records = book.make(base="tiny")          # before anything runs; ExperimentError on bad input
    book.load(url, ("r8",), token)            # a trial's adapters
    book.unload(url, ("r8",), token)
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from loadlens.contracts.experiment_result import AdapterRecord
from loadlens.experiment.models import ExperimentError, PlannedAdapter


class AdapterLoadError(RuntimeError):
    """The server refused or could not be asked to load or unload an adapter; the message says which."""


def _post(url: str, body: dict[str, str], token: str | None, timeout: float = 120.0) -> None:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace").strip().replace("\n", " ")[:300]
        raise AdapterLoadError(f"POST {url} {body}: HTTP {err.code}: {detail}") from err
    except (urllib.error.URLError, OSError) as err:
        raise AdapterLoadError(f"POST {url}: {err}") from err


class AdapterBook:
    """The experiment's adapters: where they are written, where the server reads them, which are loaded."""

    def __init__(self, planned: list[PlannedAdapter], directory: Path, server_dir: str | None = None) -> None:
        self.planned = {a.name: a for a in planned}
        self.directory = directory
        self.server_dir = server_dir.rstrip("/") if server_dir else None
        self.loaded: dict[str, set[str]] = {}
        """Base URL -> the adapters this experiment loaded there (and has not unloaded)."""

    def __bool__(self) -> bool:
        return bool(self.planned)

    def server_path(self, name: str) -> str:
        """Where the server reads adapter ``name``: under ``--server-adapter-dir`` when given, else our path."""
        if self.server_dir:
            return f"{self.server_dir}/{name}"
        return str((self.directory / name).resolve())

    def make(self, base: str) -> list[AdapterRecord]:
        """Write every adapter for ``base`` (a config.json, model directory or sim model profile); files of an
        earlier run of this experiment directory are replaced by the same bytes (seeded)."""
        from loadlens.lora import LoraError, make_adapter

        records: list[AdapterRecord] = []
        for a in self.planned.values():
            try:
                made = make_adapter(
                    base, self.directory / a.name, rank=a.rank, alpha=a.alpha, target_modules=list(a.target_modules),
                    dtype=a.dtype, init_b=a.init_b, seed=a.seed, force=True,
                )  # fmt: skip
            except LoraError as err:
                raise ExperimentError(f"adapter {a.name}: {err}") from None
            records.append(
                AdapterRecord(
                    name=a.name,
                    rank=a.rank,
                    alpha=a.alpha,
                    target_modules=list(made.target_modules),
                    dtype=a.dtype,
                    init_b=a.init_b,
                    seed=a.seed,
                    base=base,
                    path=str(self.directory / a.name),
                    server_path=self.server_path(a.name),
                    formula_bytes=made.formula_bytes,
                    file_bytes=made.file_bytes,
                )  # fmt: skip
            )
        return records

    def lora_modules(self, names: tuple[str, ...]) -> str:
        """vLLM's ``--lora-modules`` value for ``names`` (space-separated ``name=path``)."""
        return " ".join(f"{n}={self.server_path(n)}" for n in names)

    def load(self, url: str, names: tuple[str, ...], token: str | None = None) -> None:
        here = self.loaded.setdefault(url, set())
        for name in names:
            if name in here:
                continue
            _post(f"{url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": self.server_path(name)}, token)
            here.add(name)

    def unload(self, url: str, names: tuple[str, ...], token: str | None = None) -> None:
        """Unload ``names`` where this experiment loaded them; every one is tried, the first failure raised."""
        here = self.loaded.get(url, set())
        first: AdapterLoadError | None = None
        for name in names:
            if name not in here:
                continue
            try:
                _post(f"{url}/v1/unload_lora_adapter", {"lora_name": name}, token)
            except AdapterLoadError as err:
                first = first or err
            here.discard(name)
        if first is not None:
            raise first

    def forget(self, url: str) -> None:
        """The server at ``url`` was stopped: nothing is loaded there any more."""
        self.loaded.pop(url, None)
