"""The proxy's work per upstream read, in process and by part: deterministic where ``serving.py`` is not.

Run: ``python -m benchmarks.proxy_path [--quick]`` (``make bench`` runs it). No sockets and no servers: recorded
bytes (the sim's streamed completions chunks, HTTP/1.1 chunked as the sim sends them) go through the proxy's
own objects as one socket read each, with a stand-in transport on both sides whose ``write`` does nothing:

1. the whole read path: ``Connection.data_received`` (httptools) -> ``ProxyStream.on_data`` ->
   ``FrameReader.feed`` -> timing marks -> the HTTP layer's sink (``_Streamed.deliver``: ``on_event`` with the
   request's tally of tokens and inter-token gaps) -> ``DirectBody.write``, which holds the chunk in the loop's
   ``WriteBatch``, and the batch's flush after each read (the live server flushes once per pass over the
   ready sockets, after up to one read per stream), with a consumer task waiting in ``__anext__`` as the HTTP
   layer's does;
2. each part of it alone, the same calls with the same arguments;
3. the whole read path again over 64 streams in turn, with the CPU caches evicted between reads (an 8 MiB
   buffer written over): closer to a server on a shared machine, where each read finds its code and data out of
   cache, than the loop of 1 that runs hot.

Figures are CPU time (``time.thread_time``, so other processes' load does not count), medians of 5 repeats,
per read. What the socket reads and writes cost (the kernel, uvloop) is not here: ``serving.py --proxy-floor``
measures that as the zero-work relay's CPU per chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from exporters.serving.direct_body import DirectBody, WriteBatch
from exporters.serving.engine import GenerationRequest, OutputEvent, SamplingParams
from exporters.serving.engines.openai.frames import FrameReader
from exporters.serving.engines.openai.stream import ProxyStream
from exporters.serving.engines.openai.upstream_connection import Connection
from exporters.serving.lifecycle import RequestLifecycle
from exporters.serving.metrics import SeriesSet, ServingMetrics
from exporters.serving.request_log import RequestLogger
from exporters.serving.responses import ChunkWriter
from exporters.serving.streaming import _Streamed
from loadlens.contracts.slo import load_slos

MODEL = "deepseek-r1-distill-llama-8b"
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
EVICT_BYTES = 8 * 2**20


class _Transport:
    """Both sides' transport: writes go nowhere."""

    def write(self, data: bytes) -> None:
        return None

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        return None

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None


class _Pool:
    """What a Connection asks of its pool."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.read_timeout_s = 600.0

    def lost(self, conn: Connection) -> None:
        return None


class _Cycle:
    """What DirectBody reads of uvicorn's RequestResponseCycle: a response that may be written now."""

    def __init__(self) -> None:
        self.transport = _Transport()
        self.flow = self
        self.write_paused = False
        self.disconnected = False
        self.response_complete = False


def frames(n: int) -> list[bytes]:
    """``n`` SSE frames as the sim streams a completion, one token each."""
    writer = ChunkWriter("completions", "cmpl-0123456789abcdef", MODEL, 1_700_000_000, False)
    return [writer.content(f" word{i % 97}", 0, 0, None, None) for i in range(n)]


def reads(n: int) -> list[bytes]:
    """The same frames as socket reads of a chunked HTTP/1.1 body."""
    return [b"%x\r\n%b\r\n" % (len(f), f) for f in frames(n)]


def _request() -> GenerationRequest:
    return GenerationRequest(
        request_id="r", endpoint="completions", model=MODEL, prompt="p", image_count=0,
        sampling=SamplingParams(max_tokens=128, ignore_eos=True), arrival_time=time.monotonic(),
        body={"model": MODEL, "prompt": "p", "stream": True}, stream_requested=True,
    )  # fmt: skip


def _life(metrics: ServingMetrics) -> RequestLifecycle:
    life = RequestLifecycle.start(
        metrics=metrics, logger=RequestLogger("logfmt"), tracer=None, parent=None, parent_ids=None,
        request_id="r", path="/v1/completions", endpoint="completions", requested_model=MODEL, model_label=MODEL,
        priority=0, priority_class=metrics.slos.classes[0], stream=True, arrival=time.monotonic(),
    )  # fmt: skip
    life.admit()
    return life


async def _connection(pool: _Pool) -> tuple[Connection, Any]:
    conn = Connection(pool)  # type: ignore[arg-type]
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    exchange = asyncio.ensure_future(conn.exchange(b"POST /v1/completions HTTP/1.1\r\n\r\n", False))
    await asyncio.sleep(0)
    conn.data_received(HEAD)
    return conn, await exchange


class _Pipeline:
    """One proxied streamed request, from its upstream connection to its client's transport."""

    def __init__(self, conn: Connection, stream: ProxyStream, consumer: asyncio.Task[OutputEvent]) -> None:
        self.conn = conn
        self.stream = stream
        self.consumer = consumer
        self._flush = WriteBatch.of_running_loop().flush

    def read(self, data: bytes) -> None:
        """One upstream read, its chunk written by the batch's flush as the loop's next pass would."""
        self.conn.data_received(data)
        self._flush()


async def _pipeline(pool: _Pool, metrics: ServingMetrics) -> _Pipeline:
    conn, response = await _connection(pool)
    stream = ProxyStream(response, _request(), "http://upstream")
    response.consume(stream.on_data, stream.on_end)
    out = _Streamed(_life(metrics), ChunkWriter("completions", "cmpl-r", MODEL, 0, False), sent_role=True)
    out.attach(stream, DirectBody(_Cycle()))
    consumer = asyncio.ensure_future(stream.__anext__())  # waits with nothing queued: events go to the sink
    await asyncio.sleep(0)
    return _Pipeline(conn, stream, consumer)


def per_call(fn: Callable[[Any], object], args: list[Any], repeat: int = 5) -> float:
    """Median CPU µs per call of ``fn`` over ``args``."""
    samples = []
    for _ in range(repeat):
        t0 = time.thread_time()
        for a in args:
            fn(a)
        samples.append((time.thread_time() - t0) / len(args))
    return statistics.median(samples) * 1e6


def evicted(pipes: list[_Pipeline], data: list[bytes], repeat: int = 5) -> float:
    """Median CPU µs per read over ``pipes`` in turn, caches evicted before each read (not counted)."""
    junk = bytearray(EVICT_BYTES)
    ones = b"\x01" * len(junk[::64])
    samples = []
    for _ in range(repeat):
        spent = 0.0
        for i, d in enumerate(data):
            junk[::64] = ones
            t0 = time.thread_time()
            pipes[i % len(pipes)].read(d)
            spent += time.thread_time() - t0
        samples.append(spent / len(data))
    # thread_time itself, read twice per read, is part of each sample: taken out.
    t0 = time.thread_time()
    for _ in data:
        time.thread_time()
    clock = (time.thread_time() - t0) / len(data)
    return (statistics.median(samples) - clock) * 1e6


async def measure(n: int, streams: int) -> list[tuple[str, float]]:
    pool = _Pool()
    metrics = ServingMetrics(CollectorRegistry(), load_slos(), "openai", "bench")
    data, payloads = reads(n), frames(n)
    rows: list[tuple[str, float]] = []

    pipe = await _pipeline(pool, metrics)
    rows.append(("whole read path (1 stream, hot)", per_call(pipe.read, data)))
    assert not pipe.consumer.done() and not pipe.stream._events, "every event went to the sink"

    idle, _ = await _connection(pool)
    idle.on_data = lambda body: None
    rows.append(("  Connection.data_received + httptools", per_call(idle.data_received, data)))
    reader = FrameReader.for_request(_request(), "http://upstream")
    rows.append(("  FrameReader.feed (learned chunk)", per_call(reader.feed, payloads)))
    searching = FrameReader.for_request(_request(), "http://upstream")
    searching._learn = lambda data: None  # type: ignore[method-assign]
    rows.append(("  FrameReader.feed (byte search)", per_call(searching.feed, payloads)))
    event = reader.feed(payloads[0])
    assert event is not None
    marks = ProxyStream(pipe.stream._response, _request(), "http://upstream")
    rows.append(("  ProxyStream._progress (timing marks)", per_call(lambda e: marks._progress(e), [event] * n)))
    out = _Streamed(_life(metrics), ChunkWriter("completions", "cmpl-r", MODEL, 0, False), sent_role=True)
    rows.append(("  _Streamed.take (on_event and the event's fields)", per_call(out.take, [event] * n)))
    life = _life(metrics)
    now = time.monotonic
    rows.append(("    RequestLifecycle.on_event", per_call(lambda i: life.on_event(now(), 1, 10, i), list(range(n)))))
    tally = life.tally
    assert tally is not None

    def add_tokens(amount: int) -> None:
        tally.tokens += amount

    rows.append(("      token counter (the request's tally)", per_call(add_tokens, [1] * n)))
    rows.append(("      ITL histogram (the request's tally)", per_call(tally.observe_itl, [0.008] * n)))
    tallies = metrics.tallies

    def one_request(series: SeriesSet) -> None:
        """A request's tally opened, holding what 128 tokens leave in it (127 gaps in two buckets), and folded."""
        opened = tallies.open(series)
        opened.tokens += 128
        opened.itl_sum += 1.124
        opened.counts[0] += 100
        opened.counts[1] += 27
        tallies.close(opened)

    rows.append(("  a request's tally opened and folded in, per request", per_call(one_request, [tally.series] * n)))
    framing = DirectBody(_Cycle()).write
    rows.append(("  DirectBody.write (chunk framing; the write goes nowhere)", per_call(framing, payloads)))

    pipes = [await _pipeline(pool, metrics) for _ in range(streams)]
    rows.append((f"whole read path ({streams} streams in turn, caches evicted)", evicted(pipes, data)))
    for p in [pipe, *pipes]:
        p.consumer.cancel()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer reads (smoke test of the benchmark itself)")
    parser.add_argument("--streams", type=int, default=64, help="streams read in turn for the evicted-cache row")
    args = parser.parse_args(argv)
    n = 2_000 if args.quick else 20_000
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with the serve extra
        rows = asyncio.run(measure(n, args.streams))
    else:
        rows = uvloop.run(measure(n, args.streams))
    print(f"\n## The proxy's CPU per upstream read, by part ({n} reads; CPU µs per read, medians of 5)")
    for name, us in rows:
        print(f"{name:66} {us:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
