"""The proxy's MFU estimate (``loadlens serve --engine openai --model-config ... --enable-mfu-metrics``):
vLLM's ``vllm:estimated_{flops,read_bytes,write_bytes}_per_gpu_total``, labelled as vLLM labels them
(``model_name``, ``engine``), counted from each finished request's token counts with vLLM's own terms
(``loadlens/contracts/mfu.py``, docs/serving.md).

A request is counted when it finishes (the upstream's usage: prompt, completion and cached prompt tokens), as
vLLM would run it unchunked: one prefill, then one decode step per output token after the first. The weights,
read once per engine step for the whole batch, are shared among the requests in flight: each request is
billed its steps divided by the mean number of proxy requests in flight over its life (time-weighted, itself
included), so N requests batched together are billed the weights of their steps once, not N times. A request
that did not finish (aborted, failed) is not counted. What the proxy cannot see is in docs/serving.md.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from exporters.serving.engine import RequestStream
from exporters.serving.engines.openai.stream import ProxyStream
from exporters.serving.engines.openai.whole import WholeAnswer
from loadlens.contracts import mfu

ENGINE = "0"
"""vLLM's ``engine`` label of a single-engine server (data-parallel rank 0)."""


@dataclass(slots=True)
class Ticket:
    """One request in flight: when it began and the in-flight area (request-seconds) then."""

    start: float
    area: float


class ProxyMfu:
    """The three counters and the in-flight area they share weights by."""

    def __init__(
        self, shape: mfu.Shape, registry: CollectorRegistry, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.shape = shape
        self._clock = clock
        labels = ("model_name", "engine")
        what = "(for Model Flops Utilization calculations; the proxy's estimate from token counts)."
        self.flops = Counter("vllm:estimated_flops_per_gpu", f"Estimated number of floating point operations per "
                             f"GPU {what}", labels, registry=registry)  # fmt: skip
        self.read_bytes = Counter("vllm:estimated_read_bytes_per_gpu", f"Estimated number of bytes read from "
                                  f"memory per GPU {what}", labels, registry=registry)  # fmt: skip
        self.write_bytes = Counter("vllm:estimated_write_bytes_per_gpu", f"Estimated number of bytes written to "
                                   f"memory per GPU {what}", labels, registry=registry)  # fmt: skip
        self._in_flight = 0
        self._area = 0.0  # ∫ in_flight dt up to self._last
        self._last = clock()

    def _advance(self) -> float:
        now = self._clock()
        self._area += self._in_flight * (now - self._last)
        self._last = now
        return now

    def begin(self) -> Ticket:
        now = self._advance()
        self._in_flight += 1
        return Ticket(now, self._area)

    async def track(self, model_name: str, generating: Awaitable[RequestStream]) -> RequestStream:
        """The stream ``generating`` opens, counted when it ends (a refused or failed one, never)."""
        ticket = self.begin()
        try:
            stream = await generating
        except BaseException:
            self.end(ticket, model_name, None)
            raise
        if isinstance(stream, ProxyStream):
            stream.on_close(lambda usage: self.end(ticket, model_name, None if usage is None else (*usage, 0)))
        else:
            self.end(ticket, model_name, stream.usage() if isinstance(stream, WholeAnswer) else None)
        return stream

    def end(self, ticket: Ticket, model_name: str, usage: tuple[int, int, int] | None) -> None:
        """The request of ``ticket`` left; ``usage`` (prompt, completion, cached prompt tokens) when it finished,
        None when it did not (nothing is counted)."""
        now = self._advance()
        self._in_flight -= 1
        if usage is None:
            return
        prompt, output, cached = usage
        if prompt <= 0:
            return
        lived = now - ticket.start
        concurrency = (self._area - ticket.area) / lived if lived > 0 else 1.0
        work = mfu.request_work(prompt, output, cached)
        work.steps /= max(1.0, concurrency)
        est = mfu.estimate(self.shape, work)
        self.flops.labels(model_name, ENGINE).inc(est.flops)
        self.read_bytes.labels(model_name, ENGINE).inc(est.read_bytes)
        self.write_bytes.labels(model_name, ENGINE).inc(est.write_bytes)
