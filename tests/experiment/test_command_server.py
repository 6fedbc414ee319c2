"""What a real server (vLLM) needs of ``--server-command``'s process handling: the whole process group is
stopped after a trial, also the children that outlive their leader and ignore SIGTERM (vLLM's ``EngineCore``
and workers can), and a trial never measures a server that answered before its own was started."""

from __future__ import annotations

import http.server
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from loadlens.experiment.models import PlannedTrial
from loadlens.experiment.servers import CommandServer, ServerError, _Child

# The leader starts a child that ignores SIGTERM, waits until it does, writes its pid and exits.
ORPHAN = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                          " print('ready', flush=True); time.sleep(300)"], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "ready\\n"
print(child.pid, flush=True)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_stop_kills_a_child_that_outlived_its_leader_and_ignores_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    child = _Child([sys.executable, "-c", ORPHAN], log)
    assert child.proc.wait(timeout=30) == 0  # the leader is gone; its child is not
    pid = int(log.read_text().strip())
    assert alive(pid)
    child.stop(grace_s=0.2)
    # SIGKILL is delivered before killpg returns; the orphan is reaped by init, so poll until it is gone.
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(pid)


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def answering() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_url_that_answers_before_the_trials_server_started_is_refused(tmp_path: Path) -> None:
    trial = PlannedTrial(index=0, name="s2", profile="p", knobs={"max_num_seqs": 2}, vars={}, params={}, host=None)
    with answering() as url:
        server = CommandServer("sleep {max_num_seqs}", url, tmp_path)
        with pytest.raises(ServerError) as err:
            server.prepare(trial)
    assert str(err.value) == f"trial s2: {url}/health answers before its server started"
    assert not (tmp_path / "s2").exists()  # nothing was started
