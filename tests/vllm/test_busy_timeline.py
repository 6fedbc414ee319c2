"""The busy timeline inside the real vLLM's CPU worker (issue 24 item 3): the plugin times the model runner's
execute_model and sample_tokens with perf_counter (the CPU worker's step runs on its thread), and the probe
document's ``busy`` section accounts for a run of requests: two intervals per engine step, busy seconds no more
than the run lasted."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from loadlens.contracts.probe_document import ProbeBusy, ProbeDocument
from tests.support import vllm_server as rig
from tests.vllm.test_probe import the_document

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REQUESTS = 3
TOKENS = 8


def document_after(directory: Path, when: float, timeout_s: float = 30.0) -> ProbeDocument:
    """The first document written after ``when`` (the probe writes every 5 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        doc = the_document(directory)
        if doc.written_at > when or time.monotonic() > deadline:
            assert doc.written_at > when, "no probe document written after the run"
            return doc
        time.sleep(0.1)


def test_the_workers_steps_make_a_timeline_consistent_with_the_run(
    vllm_server: rig.VllmServer, vllm_probe_dir: Path
) -> None:
    before = document_after(vllm_probe_dir, time.time()).busy  # nothing of an earlier test's run still to come
    assert isinstance(before, ProbeBusy)
    assert (before.source, before.clock, before.cuda_index, before.uuid) == (
        "vllm_execute_model",
        "perf_counter",
        None,
        "",
    )
    body = {"model": vllm_server.served_name, "prompt": "Load tests", "max_tokens": TOKENS, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    start = time.time()
    with httpx.Client(base_url=vllm_server.url, timeout=120) as client:
        for _ in range(REQUESTS):  # one at a time: one sequence per step
            answer = client.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == TOKENS
    end = time.time()
    after = document_after(vllm_probe_dir, end).busy
    assert isinstance(after, ProbeBusy)
    intervals = after.intervals_total - before.intervals_total
    busy = after.busy_seconds_total - before.busy_seconds_total
    print(f"\n{REQUESTS} requests x {TOKENS} tokens: {intervals} intervals, {busy:.3f} s busy of {end - start:.3f} s")
    # Each token is one engine step (the first one's prefill included): execute_model, then sample_tokens.
    assert intervals == 2 * REQUESTS * TOKENS
    assert 0 < busy <= end - start
    # The window ends at the document's write; when the run lies in it, so does all of its busy time (and maybe
    # an earlier test's steps).
    if after.window_start <= start:
        assert after.busy_ratio * after.window_seconds >= busy * (1 - 1e-6)
        assert after.busy_run is not None and after.idle_gap is not None
