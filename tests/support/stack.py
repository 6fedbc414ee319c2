"""A local stack (real Prometheus, Alertmanager, sim server, GPU exporter, pager) on free ports for one test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from loadlens.contracts.slo import DEFAULT_SLO_FILE
from loadlens.stack.runner import Stack, StackOptions
from loadlens.util.net import free_port
from tests.support.alertmanager import require_alertmanager
from tests.support.prometheus import require_prometheus


@contextlib.contextmanager
def running_stack(tmp_path: Path, *, alerting: dict[str, Any] | None = None, **options: Any) -> Iterator[Stack]:
    """``tiny`` on ``h100-sxm``, scraped every second; ``alerting`` overrides keys of the packaged SLO file's
    alerting section (e.g. short latency windows), ``options`` any other StackOptions field."""
    require_prometheus()
    require_alertmanager()
    if alerting:
        slo = yaml.safe_load(DEFAULT_SLO_FILE.read_text())
        slo["alerting"].update(alerting)
        options["slo_file"] = tmp_path / "slos.yaml"
        options["slo_file"].write_text(yaml.safe_dump(slo))
    ports = ("serve", "gpu", "pager", "loadgen", "training", "prometheus", "alertmanager")
    settings: dict[str, Any] = {f"{name}_port": free_port() for name in ports}
    settings.update(model_profile="tiny", gpu_profile="h100-sxm", scrape_interval="1s")
    settings.update(options)
    stack = Stack(StackOptions(run_dir=tmp_path / "run", **settings), say=lambda _: None)
    stack.up()
    try:
        yield stack
    finally:
        stack.down()
