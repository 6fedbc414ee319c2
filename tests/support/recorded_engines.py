"""A real Prometheus serving the recorded engine expositions of tests/fixtures/sglang/ (one modelled workload
as sglang and as vLLM expose it; tests/dashboards/engine_expositions.py), for tests of what loadlens reads
from each engine's series.

Both recordings go into one TSDB (``promtool tsdb create-blocks-from openmetrics``) under the serving job,
each at its own time: sglang's at the recording's times, vLLM's ``OFFSET["vllm"]`` seconds later, so a
query over one dialect's window never sees the other's samples, yet the same requests sit at the same
place in each window. The data lies in the past: every query needs its ``time=`` (instant) or
``start``/``end`` (range) inside ``window(dialect)``.

    with recorded_prometheus(tmp_path) as prom:
        lo, hi = window("sglang")
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from loadlens.contracts.ports import SERVE_JOB
from tests.dashboards import engine_expositions as rec
from tests.dashboards.test_engine_dialects import INSTANCE, with_target_labels
from tests.support.prometheus import PrometheusServer, prometheus_on_openmetrics

DIALECTS = ("sglang", "vllm")
FILES = {"sglang": rec.SGLANG_FILE, "vllm": rec.VLLM_FILE}
# Far more than any range or lookback (5 min) a test queries with.
OFFSET = {"sglang": 0, "vllm": 3600}


def window(dialect: str) -> tuple[int, int]:
    """The first and last scrape of one dialect's recording (Unix seconds)."""
    start = rec.START + OFFSET[dialect]
    return start, start + rec.DURATION


def shifted(text: str, seconds: int) -> str:
    """An OpenMetrics text with every sample's timestamp moved by ``seconds``."""
    if seconds == 0:
        return text
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            out.append(line)
        else:
            head, ts = line.rsplit(" ", 1)
            out.append(f"{head} {int(ts) + seconds}")
    return "\n".join(out) + "\n"


def scrapes(dialect: str) -> dict[int, str]:
    """The recording as the engine's ``GET /metrics`` answered at each scrape: recording time -> text
    exposition (no timestamps, HELP and TYPE kept)."""
    out: dict[int, list[str]] = {}
    meta: list[str] = []
    for line in FILES[dialect].read_text().splitlines():
        if line.startswith("# EOF"):
            continue
        if line.startswith("#"):
            meta.append(line)
            continue
        head, ts = line.rsplit(" ", 1)
        out.setdefault(int(ts), []).append(head)
    return {ts: "\n".join(meta + lines) + "\n" for ts, lines in sorted(out.items())}


@contextmanager
def recorded_prometheus(work: Path) -> Iterator[PrometheusServer]:
    """Prometheus on both recordings (skips without prometheus or promtool)."""
    parts = [
        shifted(with_target_labels(FILES[d].read_text(), SERVE_JOB, INSTANCE[d]), OFFSET[d]).removesuffix("# EOF\n")
        for d in DIALECTS
    ]
    with prometheus_on_openmetrics(work, "".join(parts) + "# EOF\n") as prom:
        yield prom
