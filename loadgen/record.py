"""One measured request, its outcome, and how it is judged against its priority class's SLOs."""

from __future__ import annotations

from dataclasses import dataclass, field

from loadlens.contracts.slo import PriorityClass

SUCCESS = "success"
OUTCOMES: tuple[str, ...] = (
    SUCCESS,
    "rate_limited",  # HTTP 429
    "client_error",  # other 4xx: our request was refused (bad profile for this model, unknown model)
    "server_error",  # 5xx
    "stream_error",  # 200, then an error event or a stream that ended without [DONE]
    "connection_error",  # refused, reset, DNS
    "timeout",  # no byte for request_timeout_s
    "cancelled",  # stopped by the load generator itself (user stopped mid-request); not a failure
)
"""The bounded ``outcome`` label values."""

FAILED_OUTCOMES = frozenset(OUTCOMES) - {SUCCESS, "cancelled"}
SLO_NAMES: tuple[str, ...] = ("ttft", "itl", "e2e")


def outcome_for_status(status: int) -> str:
    if status == 429:
        return "rate_limited"
    if 400 <= status < 500:
        return "client_error"
    return "server_error"


@dataclass(slots=True)
class RequestRecord:
    """Client-side timings of one request, in seconds, measured from its *intended* start.

    For closed-loop users the intended start is when the request was sent; for open-loop stages it is the
    scheduled arrival time, so queueing inside the load generator counts against the request
    (coordinated-omission correction) and ``dispatch_lag`` says how late it was really sent.
    """

    outcome: str = SUCCESS
    reason: str = ""
    status: int = 0
    ttft: float | None = None
    e2e: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    usage_reported: bool = False
    itl: list[tuple[float, int]] = field(default_factory=list)
    """Per-token ITL samples as (seconds per token, tokens): a chunk bringing k tokens after a gap g gives
    (g / k, k). From ``usage.completion_tokens`` when the server sends continuous usage stats."""
    chunk_gaps: list[float] = field(default_factory=list)
    """Gaps between consecutive content chunks, whatever they hold (the fallback ITL series)."""
    itl_source: str = "usage"
    """``usage`` (per token, from usage deltas) or ``chunk`` (no continuous usage: chunk gaps stand in)."""
    dispatch_lag: float | None = None
    chunks: int = 0
    content: str | None = None
    """The reply text as streamed, only when the request asked for it (conversations); else None."""

    @property
    def ok(self) -> bool:
        return self.outcome == SUCCESS

    @property
    def tpot(self) -> float | None:
        """(E2E − TTFT) / (n − 1), as vLLM computes it; None when n ≤ 1."""
        if self.ttft is None or self.e2e is None or self.output_tokens <= 1:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def itl_samples(self) -> list[tuple[float, int]]:
        """The ITL series this request contributes: per token when possible, else one per chunk gap."""
        if self.itl_source == "usage":
            return self.itl
        return [(g, 1) for g in self.chunk_gaps]


def breaches(record: RequestRecord, cls: PriorityClass) -> list[str]:
    """SLOs a successful request missed: ``ttft``, ``itl`` (judged on its TPOT, like the server), ``e2e``.

    The same rules as the serving layer's ``loadlens_sla_breaches_total``, so client and server goodput
    differ only by what happens on the wire.
    """
    missed: list[str] = []
    if record.ttft is None or record.ttft > cls.ttft_seconds:
        missed.append("ttft")
    tpot = record.tpot
    if tpot is not None and tpot > cls.itl_seconds:
        missed.append("itl")
    if record.e2e is None or record.e2e > cls.e2e_seconds:
        missed.append("e2e")
    return missed
