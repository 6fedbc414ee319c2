"""The harness of ``benchmarks/gpu_probe_check.py``: numbered steps of PASS/FAIL checks (``Report``), the
CUDA guard and package versions, and the rig: the in-process probe read by an in-process GPU exporter, one
scrape turned into this process's allocator figures. Needs no GPU itself (tests/benchmarks/test_gpu_probe_check.py
runs it on a fake torch).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks.gpu_nvml_check import scrape_samples

PACKAGES = ("torch", "transformers", "peft", "accelerate", "safetensors", "pydantic", "prometheus-client")


# --- bookkeeping ----------------------------------------------------------------------------------------


class Report:
    """Numbered steps of checks; a step that raises is one FAIL and the next step still runs."""

    def __init__(self, log: Callable[[str], None] = print) -> None:
        self.steps: list[dict[str, Any]] = []
        self.log = log
        self.data: dict[str, Any] = {}

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[dict[str, Any]]:
        entry: dict[str, Any] = {"step": len(self.steps) + 1, "title": title, "checks": [], "values": {}}
        self.steps.append(entry)
        self.log(f"== {entry['step']}. {title}")
        start = time.perf_counter()
        try:
            yield entry["values"]
        except Exception as err:
            reason = f"{type(err).__name__}: {err}"
            entry["error"] = reason
            entry["traceback"] = traceback.format_exc()
            self.check(f"step {entry['step']} ran to the end", False, reason)
        finally:
            entry["seconds"] = round(time.perf_counter() - start, 3)

    def check(self, name: str, ok: bool, detail: Any) -> bool:
        entry = self.steps[-1] if self.steps else self._orphan()
        entry["checks"].append({"check": name, "ok": bool(ok), "detail": detail})
        self.log(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
        return bool(ok)

    def _orphan(self) -> dict[str, Any]:
        self.steps.append({"step": 0, "title": "outside a step", "checks": [], "values": {}})
        return self.steps[-1]

    @property
    def checks(self) -> list[dict[str, Any]]:
        return [c for s in self.steps for c in s["checks"]]

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c["ok"] for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        passed = sum(c["ok"] for c in self.checks)
        return {"ok": self.ok, "passed": passed, "failed": len(self.checks) - passed, **self.data, "steps": self.steps}


def cuda_missing(torch_import: Callable[[], Any] = lambda: importlib.import_module("torch")) -> str | None:
    """None when torch with CUDA is usable, else the one-line reason to exit 2 with."""
    try:
        torch = torch_import()
    except Exception as err:  # ImportError, or a broken CUDA install raising OSError
        return f"torch cannot be imported ({type(err).__name__}: {err}); run this on a GPU host with a CUDA torch"
    if not torch.cuda.is_available():
        build = getattr(torch.version, "cuda", None)
        return (
            f"CUDA is not available (torch {torch.__version__}, CUDA build {build}); "
            "run this on a GPU host (see benchmarks/README.md)"
        )
    return None


def versions(names: Sequence[str] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


# --- the rig --------------------------------------------------------------------------------------------


def _one(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float | None:
    for lbls, value in samples.get(name, []):
        if all(lbls.get(k) == v for k, v in labels.items()):
            return value
    return None


ALLOC_FIELDS = ("reserved", "allocated", "requested", "rounding_overhead", "segments", "free", "largest_free_block")


class Rig:
    """The probe and the exporter, and one scrape of both as a dict of this process's allocator figures."""

    def __init__(self, out: Path, directory: Path, torch: Any) -> None:
        self.out, self.directory, self.torch = out, directory, torch
        self.probe: Any = None
        self.exporter: Any = None
        self.pid = str(os.getpid())

    def scrape(self, name: str | None = None, fresh_snapshot: bool = True) -> dict[str, Any]:
        probe = self.probe
        if probe is not None:
            if fresh_snapshot:
                # The probe takes a snapshot only when one is due; its interval here is tiny (set below).
                time.sleep(min(2.0, probe.snapshot_interval) + 0.01)
            probe.write_now()
        self.exporter.sample_now()  # a sampling pass after the write: the scrape serves the latest pass
        text = self.exporter.scrape().decode()
        if name:
            (self.out / f"probe-{name}.prom").write_text(text)
        s = scrape_samples(text)
        mine = {"pid": self.pid, "role": "trainer"}
        fig: dict[str, Any] = {
            f: _one(s, f"loadlens_gpu_allocator_{f}_bytes", **mine) for f in ALLOC_FIELDS if f != "segments"
        }
        fig["segments"] = _one(s, "loadlens_gpu_allocator_segments", **mine)
        fig["fragmentation_ratio"] = _one(s, "loadlens_gpu_allocator_fragmentation_ratio", **mine)
        fig["gpu_label"] = next(
            (
                lb.get("gpu")
                for lb, _ in s.get("loadlens_gpu_allocator_reserved_bytes", [])
                if lb.get("pid") == self.pid
            ),
            None,
        )
        fig["pools"] = {
            f"{lb['pool']}/{lb['size_class']}": {
                "segments": v,
                "reserved_bytes": _one(s, "loadlens_gpu_allocator_pool_reserved_bytes", **lb),
            }
            for lb, v in s.get("loadlens_gpu_allocator_pool_segments", [])
            if lb.get("pid") == self.pid
        }
        fig["documents"] = _one(s, "loadlens_gpu_probe_documents")
        fig["dropped"] = {lb["reason"]: v for lb, v in s.get("loadlens_gpu_probe_documents_dropped", []) if v}
        fig["roles"] = sorted({lb.get("role", "") for lb, _ in s.get("loadlens_gpu_probe_info", [])})
        fig["collector_ok"] = _one(s, "loadlens_gpu_collector_success", collector="probe")
        fig["snapshot_seconds"] = _one(s, "loadlens_gpu_probe_snapshot_duration_seconds", **mine)
        return fig
