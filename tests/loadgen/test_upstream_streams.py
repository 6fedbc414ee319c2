"""Recorded vLLM, sglang, llama.cpp and TGI streams (tests/fixtures/upstream_streams) through the load
generator: StreamParser with each frame's exact arrival time, then the real client (geventhttpclient, in a
child process: gevent stays out of pytest) against a server that replays the bytes with their timing."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from loadgen.sse import StreamParser
from tests.fixtures.upstream_streams import FIXTURE_HEADER, NAMES, ReplayUpstream, load
from tests.support.paths import ROOT

START = 100.0


def _parse(name: str) -> tuple[StreamParser, Any]:
    fixture = load(name)
    parser = StreamParser(chat=fixture.endpoint == "chat", start=START)
    end = START
    for t, line in fixture.lines():
        end = START + t
        if parser.feed(line, end):
            break
    return parser, parser.finish(end)  # the end of the body: the last frame's arrival


def test_every_fixture_is_here() -> None:
    kinds = {load(n).source["kind"] for n in NAMES}
    assert kinds == {"vllm", "sglang", "llamacpp", "tgi"}
    assert {load(n).endpoint for n in NAMES} == {"chat", "completions"}
    assert len(NAMES) == 17


@pytest.mark.parametrize("name", NAMES)
def test_stream_parser_measures_each_recorded_stream(name: str) -> None:
    expect = load(name).expect
    parser, record = _parse(name)
    assert (record.outcome, record.reason) == ("success", "")
    assert (parser.done is not None) is expect["done"]
    assert record.ttft == pytest.approx(expect["ttft_ms"] / 1000, abs=1e-9)
    assert record.e2e == pytest.approx(expect["e2e_ms"] / 1000, abs=1e-9)
    assert record.output_tokens == expect["output_tokens"]
    assert record.prompt_tokens == expect["prompt_tokens"]
    assert record.usage_reported is expect["usage_reported"]
    assert record.chunks == expect["chunks"]
    assert record.itl_source == expect["itl_source"]
    # The store counts a request as an ITL fallback exactly when its source is not "usage" (store.Series.add).
    assert (record.itl_source != "usage") is expect["itl_fallback_counted"]
    assert [(round(g * 1000, 6), n) for g, n in record.itl] == [tuple(s) for s in expect["token_itl_ms"]]
    assert [round(g * 1000, 6) for g in record.chunk_gaps] == expect["chunk_gaps_ms"]
    samples = record.itl_samples()
    if expect["itl_source"] == "usage":
        assert samples == record.itl
    else:
        assert [round(g * 1000, 6) for g, _ in samples] == expect["chunk_gaps_ms"]


def test_a_body_cut_before_the_finish_chunk_is_still_a_stream_error() -> None:
    # tgi_old_chat ends without [DONE] after its finish chunk (a success); cut before that chunk, it is an error.
    fixture = load("tgi_old_chat")
    parser = StreamParser(chat=True, start=START)
    lines = list(fixture.lines())[:-2]  # drop the finish frame (its data line and blank line)
    for t, line in lines:
        parser.feed(line, START + t)
    record = parser.finish(START + 1)
    assert (record.outcome, record.reason) == ("stream_error", "stream ended without [DONE]")


_CHILD = r"""
import json, sys, time, types
from loadgen.client import Target, stream

url, specs = sys.argv[1], json.loads(sys.argv[2])
target = Target(url)
http = target.client(30.0)
for name, path, endpoint, header in specs:
    body = {"model": "m", "max_tokens": 5, "stream": True}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if endpoint == "chat" else {"prompt": "hi"})
    request = types.SimpleNamespace(
        traffic=types.SimpleNamespace(endpoint=endpoint, conversation=None), path=path, body=json.dumps(body).encode()
    )
    headers = {"content-type": "application/json", header: name}
    start = time.perf_counter()
    record, reusable, _ = stream(http, target, request, headers, start, lambda n: None, 30.0)
    print(json.dumps({"name": name, "outcome": record.outcome, "reason": record.reason, "ttft": record.ttft,
                      "e2e": record.e2e, "output_tokens": record.output_tokens, "prompt_tokens": record.prompt_tokens,
                      "itl_source": record.itl_source, "itl": record.itl, "chunk_gaps": record.chunk_gaps,
                      "chunks": record.chunks, "reusable": reusable}), flush=True)
"""


def test_the_real_client_measures_each_replayed_stream() -> None:
    """Counts and sources exactly; times only from below (a frame cannot arrive before it was sent) and
    loosely from above (a loaded CI host may delay any frame)."""
    with ReplayUpstream() as upstream:
        specs = [[n, load(n).path, load(n).endpoint, FIXTURE_HEADER] for n in NAMES]
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, upstream.url, json.dumps(specs)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    results = {r["name"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert sorted(results) == sorted(NAMES)
    for name, got in results.items():
        expect = load(name).expect
        assert (got["outcome"], got["reason"]) == ("success", ""), name
        assert got["output_tokens"] == expect["output_tokens"], name
        assert got["prompt_tokens"] == expect["prompt_tokens"], name
        assert got["itl_source"] == expect["itl_source"], name
        assert got["chunks"] == expect["chunks"], name
        assert [n for _, n in got["itl"]] == [n for _, n in expect["token_itl_ms"]], name
        assert len(got["chunk_gaps"]) == len(expect["chunk_gaps_ms"]), name
        assert expect["ttft_ms"] / 1000 - 0.002 <= got["ttft"] <= expect["ttft_ms"] / 1000 + 2.0, name
        last = (expect["ttft_ms"] + sum(expect["chunk_gaps_ms"])) / 1000  # the last content chunk's send time
        assert last - 0.002 <= got["ttft"] + sum(got["chunk_gaps"]) <= last + 2.0, name
        # Without [DONE] the client reads to the end of the body; the connection still ends cleanly.
        assert got["reusable"] is True, name
