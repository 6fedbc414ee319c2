"""benchmarks/proxy_request.py runs its quick variant: every row is measured, and each request through the
stand-in rig ends with the proxy's whole chunked response (the rig raises otherwise)."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks import proxy_request


def test_the_quick_variant_measures_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert proxy_request.main(["--quick", "--requests", "20"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line and not line.startswith("#")]
    names = [line.rsplit(maxsplit=1)[0].strip() for line in rows]
    assert names == [
        "whole request through the proxy, 1 token",
        "whole request through the proxy, 4 tokens",
        "uvicorn alone (a bare ASGI app, the same chunks), 1 token",
        "uvicorn alone (a bare ASGI app, the same chunks), 4 tokens",
        "the proxy's own per request (whole - uvicorn alone, 1 token)",
        "each further chunk ((whole at 4 - whole at 1) / 3)",
    ]
    assert all(float(line.rsplit(maxsplit=1)[1]) > 0 for line in rows[:5])


def test_the_proxy_answers_through_the_rig_with_every_token() -> None:
    async def one() -> tuple[bytes, dict[str, float]]:
        rig = await proxy_request.proxy_rig(4)
        written: list[bytes] = []
        got = rig.client.on_write
        assert got is not None
        rig.client.on_write = lambda data: (written.append(data), got(data))  # type: ignore[func-returns-value]
        await rig.request(proxy_request._request_bytes("127.0.0.1", 8000, proxy_request.MODEL, 4))
        registry = rig.protocol.app.app.state.serving.registry
        labels = {"model_name": proxy_request.MODEL, "priority_class": "interactive"}
        counts = {
            "tokens": registry.get_sample_value("loadlens_output_tokens_total", labels),
            "ok": registry.get_sample_value("loadlens_requests_total", {**labels, "code": "200"}),
        }
        return b"".join(written), counts

    response, counts = asyncio.run(one())
    assert response.startswith(b"HTTP/1.1 200 OK\r\n") and response.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert response.count(b'"text":" w') == 4  # every content chunk forwarded, the last with its finish
    assert counts == {"tokens": 4.0, "ok": 1.0}
    assert proxy_request.upstream_reads(2)[0] == proxy_request.UPSTREAM_HEAD
    assert len(proxy_request.upstream_reads(2)) == 4  # head, 2 content chunks, usage with [DONE] and the end
