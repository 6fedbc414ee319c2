"""benchmarks/proxy_path.py runs its quick variant: every part of the proxy's read path is measured, and the
whole path delivers every read to the client side without waking the consumer."""

from __future__ import annotations

import pytest

from benchmarks import proxy_path


def test_the_quick_variant_measures_every_part(capsys: pytest.CaptureFixture[str]) -> None:
    assert proxy_path.main(["--quick", "--streams", "4"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line and not line.startswith("#")]
    names = [line.rsplit(maxsplit=1)[0].strip() for line in rows]
    assert names == [
        "whole read path (1 stream, hot)",
        "Connection.data_received + httptools",
        "FrameReader.feed (learned chunk)",
        "FrameReader.feed (byte search)",
        "ProxyStream._progress (timing marks)",
        "_Streamed.take (on_event and the event's fields)",
        "RequestLifecycle.on_event",
        "token counter (the request's tally)",
        "ITL histogram (the request's tally)",
        "a request's tally opened and folded in, per request",
        "DirectBody.write (chunk framing; the write goes nowhere)",
        "whole read path (4 streams in turn, caches evicted)",
    ]
    assert all(float(line.rsplit(maxsplit=1)[1]) > 0 for line in rows)


def test_the_recorded_reads_are_chunked_sse_frames() -> None:
    reads = proxy_path.reads(3)
    assert reads[0].startswith(b"%x\r\ndata: {" % (len(proxy_path.frames(1)[0])))
    assert all(r.endswith(b"}\n\n\r\n") for r in reads)
