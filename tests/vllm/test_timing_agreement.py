"""The client's, the proxy's and vLLM's TTFT and ITL of the same requests agree as their definitions say
(benchmarks/vllm_agreement.py measures them; BENCHMARKS.md has the table and why each figure differs).

Only what the definitions guarantee is asserted, whatever the machine's load:

- TTFT: every request is counted once on each side. Per request, the client's interval contains the proxy's
  (the client writes before the proxy's arrival mark; the proxy stamps the first token before writing it on),
  and the proxy's contains vLLM's (vLLM's arrival is after the proxy forwarded; its first token is processed
  before it is sent): client mean >= proxy mean >= vLLM mean. vLLM stamps with the wall clock, the others
  with the monotonic one: their difference over a TTFT is bounded by the clock's slew (NTP: at most 500 ppm),
  which is the allowance on the proxy >= vLLM ordering.
- ITL: vLLM observes one gap per engine step that made a token, ``max_tokens - 1`` per request, exactly
  (no speculative decoding). The proxy observes one per upstream read that carried tokens, and vLLM merges
  outputs its API server has not sent yet (docs/real-vllm.md): at most vLLM's count. The client observes one
  per read that carried tokens, and reads may join what the proxy wrote apart: at most the proxy's.
"""

from __future__ import annotations

import pytest

from benchmarks.vllm_agreement import measure
from tests.support.vllm_model import SERVED_NAME
from tests.vllm.conftest import Proxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

REQUESTS, CONCURRENCY, MAX_TOKENS = 24, 3, 12
SLEW = 500e-6
"""The most an NTP-disciplined wall clock is slewed against the monotonic clock (adjtime's 500 ppm)."""


def test_client_proxy_and_vllm_timings_agree_by_definition(vllm_proxy: Proxy) -> None:
    result = measure(
        vllm_proxy.url,
        vllm_proxy.upstream.url,
        SERVED_NAME,
        requests=REQUESTS,
        concurrency=CONCURRENCY,
        max_tokens=MAX_TOKENS,
    )
    ttft, itl = result.ttft, result.itl
    print("\n" + result.table())
    assert [ttft[side].count for side in ("client", "proxy", "vllm")] == [REQUESTS] * 3
    assert ttft["client"].mean >= ttft["proxy"].mean
    assert ttft["proxy"].mean >= ttft["vllm"].mean * (1 - SLEW)
    assert itl["vllm"].count == REQUESTS * (MAX_TOKENS - 1)
    assert itl["client"].count <= itl["proxy"].count <= itl["vllm"].count
