"""The calls a trial's adapters cause on its server, recorded by a real HTTP server: each run loads the trial's
adapters before the load and unloads them after; a refused load fails the trial with the server's answer; a
refused unload keeps the run and becomes a warning; close() unloads what is left; a {lora_modules} template
gets the adapters at start-up instead."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from loadlens.experiment.adapters import AdapterBook
from loadlens.experiment.models import PlannedAdapter, PlannedTrial
from loadlens.experiment.servers import AdminServer, CommandServer, ServerError


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.refuse: set[str] = set()


@pytest.fixture
def server() -> Iterator[tuple[str, Recorder]]:
    rec = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            rec.calls.append((self.path, body))
            refused = self.path in rec.refuse
            payload = json.dumps({"error": {"message": "no", "code": 400}} if refused else {}).encode()
            self.send_response(400 if refused else 200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", rec
    httpd.shutdown()
    httpd.server_close()


def adapter(name: str) -> PlannedAdapter:
    return PlannedAdapter(name, 8, 16.0, ("q_proj", "v_proj"), "bf16", "random", 0)


def trial(name: str, *adapters: str) -> PlannedTrial:
    return PlannedTrial(0, name, "p", {}, {}, {}, None, tuple(adapters))


LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


def test_each_run_loads_its_trials_adapters_and_unloads_them_after(
    server: tuple[str, Recorder], tmp_path: Path
) -> None:
    url, rec = server
    control = AdminServer(url)
    control.adapters = AdapterBook([adapter("a"), adapter("b")], tmp_path, server_dir="/srv/adapters/")
    for t in (trial("t1", "a", "b"), trial("t2"), trial("t3", "b")):
        assert control.prepare(t) == url
        control.finish(t)
    assert rec.calls == [
        (LOAD, {"lora_name": "a", "lora_path": "/srv/adapters/a"}),
        (LOAD, {"lora_name": "b", "lora_path": "/srv/adapters/b"}),
        (UNLOAD, {"lora_name": "a"}),
        (UNLOAD, {"lora_name": "b"}),
        (LOAD, {"lora_name": "b", "lora_path": "/srv/adapters/b"}),
        (UNLOAD, {"lora_name": "b"}),
    ]
    assert control.warnings == []


def test_a_refused_load_fails_the_trial_with_the_servers_answer(server: tuple[str, Recorder], tmp_path: Path) -> None:
    url, rec = server
    rec.refuse.add(LOAD)
    control = AdminServer(url)
    control.adapters = AdapterBook([adapter("a")], tmp_path)
    with pytest.raises(ServerError) as err:
        control.prepare(trial("t1", "a"))
    assert str(err.value).startswith(f"trial t1: loading its adapters: POST {url}{LOAD} ")
    assert str(err.value).endswith('HTTP 400: {"error": {"message": "no", "code": 400}}')
    control.finish(trial("t1", "a"))  # nothing was loaded: nothing to unload
    assert [path for path, _ in rec.calls] == [LOAD]


def test_a_refused_unload_is_a_warning_and_close_unloads_what_is_left(
    server: tuple[str, Recorder], tmp_path: Path
) -> None:
    url, rec = server
    control = AdminServer(url)
    control.adapters = AdapterBook([adapter("a")], tmp_path)
    control.prepare(trial("t1", "a"))
    rec.refuse.add(UNLOAD)
    control.finish(trial("t1", "a"))
    assert len(control.warnings) == 1 and control.warnings[0].startswith("trial t1: unloading its adapters: ")
    rec.refuse.clear()
    control.prepare(trial("t2", "a"))  # the experiment forgot it after the failed unload: it asks again
    control.close()  # interrupted before finish: close unloads it
    assert [path for path, _ in rec.calls] == [LOAD, UNLOAD, LOAD, UNLOAD]


def test_a_lora_modules_template_gets_the_adapters_at_start_up(tmp_path: Path) -> None:
    control = CommandServer("vllm serve m --lora-modules {lora_modules}", "http://127.0.0.1:9", tmp_path)
    control.adapters = AdapterBook([adapter("a"), adapter("b")], tmp_path / "adapters", server_dir="/mnt/ad")
    assert control.command(trial("t", "a", "b")) == [
        "vllm",
        "serve",
        "m",
        "--lora-modules",
        "a=/mnt/ad/a",
        "b=/mnt/ad/b",
    ]
    with pytest.raises(ServerError, match=r"trial t loads no adapters for the template's \{lora_modules\}"):
        control.command(trial("t"))
