from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporters.serving.app import ServeSettings, create_app
from exporters.serving.tracing import Tracing
from tests.serving.fakes import ScriptedEngine
from tests.support.server import serve_app


@dataclass
class Served:
    url: str
    engine: ScriptedEngine
    registry: CollectorRegistry

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.registry.get_sample_value(name, labels or {})


@pytest.fixture
def lora_root(tmp_path: Path) -> Path:
    root = tmp_path / "adapters"
    (root / "a1").mkdir(parents=True)
    return root


@pytest.fixture
def served(lora_root: Path) -> Iterator[Served]:
    engine = ScriptedEngine()
    registry = CollectorRegistry()
    app = create_app(
        engine,
        ServeSettings(admin_token="s3cret", lora_root=lora_root),
        registry=registry,
        tracing=Tracing.disabled(),
    )
    with serve_app(app) as url:
        yield Served(url, engine, registry)
