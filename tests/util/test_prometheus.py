"""The one Prometheus API client: what each answer shape becomes, and which failure is which."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from loadlens.util.net import free_port
from loadlens.util.prometheus import PrometheusClient, PrometheusUnreachable, QueryError


class _Fake:
    """Answers every request with the next scripted (status, body) and records the query parameters."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, bytes]] = []
        self.seen: list[tuple[str, dict[str, str]]] = []


@pytest.fixture
def fake() -> Iterator[tuple[_Fake, str]]:
    state = _Fake()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            state.seen.append((parts.path, {k: v[0] for k, v in parse_qs(parts.query).items()}))
            status, body = state.answers.pop(0)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _ok(data: dict[str, Any]) -> tuple[int, bytes]:
    return 200, json.dumps({"status": "success", "data": data}).encode()


def test_value_at_reads_a_scalar_and_the_first_vector_sample(fake: tuple[_Fake, str]) -> None:
    state, url = fake
    state.answers = [
        _ok({"resultType": "scalar", "result": [1000.0, "2.5"]}),
        _ok({"resultType": "vector", "result": [{"metric": {}, "value": [1000.0, "7"]}]}),
    ]
    client = PrometheusClient(url + "/")
    assert client.value_at("vector(2.5)", 1000.0) == 2.5
    assert client.value_at("up", 1000.25) == 7.0
    assert state.seen == [
        ("/api/v1/query", {"query": "vector(2.5)", "time": "1000.000"}),
        ("/api/v1/query", {"query": "up", "time": "1000.250"}),
    ]


@pytest.mark.parametrize(
    "data",
    [
        {"resultType": "vector", "result": []},
        {"resultType": "vector", "result": [{"metric": {}, "value": [1.0, "NaN"]}]},
        {"resultType": "scalar", "result": [1.0, "+Inf"]},
    ],
    ids=["empty", "nan", "inf"],
)
def test_value_at_is_none_for_no_number(fake: tuple[_Fake, str], data: dict[str, Any]) -> None:
    state, url = fake
    state.answers = [_ok(data)]
    assert PrometheusClient(url).value_at("x", 1.0) is None


def test_query_range_returns_the_matrix(fake: tuple[_Fake, str]) -> None:
    state, url = fake
    matrix = [{"metric": {"job": "a"}, "values": [[1.0, "1"], [2.0, "2"]]}]
    state.answers = [_ok({"resultType": "matrix", "result": matrix})]
    assert PrometheusClient(url).query_range("up", 1.0, 2.0, 1) == matrix
    assert state.seen == [("/api/v1/query_range", {"query": "up", "start": "1.000", "end": "2.000", "step": "1"})]


def test_a_refused_query_is_a_query_error_with_prometheus_reason(fake: tuple[_Fake, str]) -> None:
    state, url = fake
    state.answers = [(400, json.dumps({"status": "error", "error": "parse error at char 3"}).encode())]
    with pytest.raises(QueryError) as err:
        PrometheusClient(url).value_at("up{", 1.0)
    assert str(err.value) == "parse error at char 3"


def test_a_server_that_is_not_prometheus_is_unreachable(fake: tuple[_Fake, str]) -> None:
    state, url = fake
    state.answers = [(200, b"<html>hello</html>"), _ok({"resultType": "vector", "result": []})]
    with pytest.raises(PrometheusUnreachable) as err:
        PrometheusClient(url).check()
    assert str(err.value) == f"{url} did not answer like a Prometheus API (not JSON)"
    PrometheusClient(url).check()  # a real API answer passes


def test_check_turns_an_api_error_into_unreachable(fake: tuple[_Fake, str]) -> None:
    state, url = fake
    state.answers = [(200, json.dumps({"status": "error", "error": "nope"}).encode())]
    with pytest.raises(PrometheusUnreachable) as err:
        PrometheusClient(url).check()
    assert str(err.value) == f"{url} did not answer like a Prometheus API: nope"


def test_connection_refused_is_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusUnreachable) as err:
        PrometheusClient(url, timeout=2.0).value_at("up", 1.0)
    assert str(err.value) == f"cannot reach Prometheus at {url}: [Errno 111] Connection refused"


def test_an_unexpected_result_shape_is_a_query_error(fake: tuple[_Fake, str]) -> None:
    state, url = fake
    state.answers = [_ok({"resultType": "vector", "result": [{"metric": {}}]})]
    with pytest.raises(QueryError) as err:
        PrometheusClient(url).value_at("up", 1.0)
    assert str(err.value) == "unexpected result shape for 'up': [{'metric': {}}]"
