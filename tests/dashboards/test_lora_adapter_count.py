"""The "LoRA adapters in use" panel counts the comma-joined adapter names of ``vllm:lora_requests_info`` in a
real Prometheus: each instance's latest label set only (vLLM keeps every set it exported), 0 for none, the cap
for more."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from loadlens.dashboards.catalog import dashboards
from loadlens.dashboards.serving import LORA_COUNT_CAP, lora_adapter_count
from tests.support.prometheus import PrometheusServer

JOB = "lora-fixture"
INFO = "vllm:lora_requests_info"
# Instance A: vLLM-style, an older set (2 running) still exported beside the latest (3 running, none waiting).
# Instance B: 1 running, 10 waiting (beyond the cap).
TEN = ",".join(f"w{i}" for i in range(10))
EXPOSITIONS = {
    "a": (
        f'{INFO}{{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters="c"}} 100\n'
        f'{INFO}{{max_lora="4",running_lora_adapters="a,b,c",waiting_lora_adapters=""}} 200\n'
    ),
    "b": f'{INFO}{{max_lora="1",running_lora_adapters="z",waiting_lora_adapters="{TEN}"}} 300\n',
}


class _Handler(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def targets() -> Iterator[list[str]]:
    servers = []
    for text in EXPOSITIONS.values():
        handler = type("H", (_Handler,), {"body": text.encode()})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield [f"127.0.0.1:{s.server_address[1]}" for s in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


def _value(prom: PrometheusServer, expr: str) -> float:
    """``expr`` once both targets have been scraped. Their ``up`` first, then the value: a scrape's samples and
    its ``up`` are committed together, so a value read after both are up holds both instances; read before the
    check, it could predate the second instance's first scrape (3 running instead of 3 + 1)."""
    deadline = time.monotonic() + 30  # a polling deadline: the first scrapes of a loaded box can take seconds
    while time.monotonic() < deadline:
        if len(prom.query(f'count(up{{job="{JOB}"}} == 1) == 2')) == 1:
            result = prom.query(expr)
            if len(result) == 1:
                return float(result[0]["value"][1])
        time.sleep(0.2)
    raise AssertionError(f"no value for {expr}")


@pytest.mark.slow
def test_counts_latest_label_set_per_instance(tmp_path: Path, targets: list[str]) -> None:
    with PrometheusServer(tmp_path, targets={JOB: targets}) as prom:
        selector = f'job="{JOB}"'
        assert _value(prom, lora_adapter_count("running_lora_adapters", selector)) == 3 + 1
        assert _value(prom, lora_adapter_count("waiting_lora_adapters", selector)) == 0 + LORA_COUNT_CAP
        only_a = f'{selector}, instance="{targets[0]}"'
        assert _value(prom, lora_adapter_count("waiting_lora_adapters", only_a)) == 0
        assert _value(prom, lora_adapter_count("running_lora_adapters", only_a, cap=2)) == 2


def test_panel_legends_are_counts() -> None:
    panel = next(p for p in dashboards()["loadlens-serving"].panels() if p.title == "LoRA adapters in use")
    assert [t.legend for t in panel.targets] == ["adapters running", "adapters waiting", "{{operation}} {{outcome}}"]
    assert "count by" not in panel.targets[0].expr
