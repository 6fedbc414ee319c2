"""Server-side figures of an sglang server: a real Prometheus on the recorded sglang and vLLM expositions of
one workload (tests/fixtures/sglang/, tests/support/recorded_engines.py), queried at the recording's own
past times as ``loadlens load --prometheus`` queries a stage (an instant query at the stage's end, its
duration as the range). The engine figures answer from sglang's counterparts (the one mapping), equal to
what the exposition's samples give, and where both dialects count the same thing, equal to vLLM's."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import pytest

from loadgen.serverside import figures_for_stages
from tests.support.prometheus import PrometheusServer
from tests.support.recorded_engines import FILES, recorded_prometheus, window

pytestmark = pytest.mark.slow

# The overload phase, on scrape times: with the range's ends on samples, increase() is their difference
# (no extrapolation), so the figures are exact.
LO, HI = 105, 195
SECONDS = HI - LO
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+) (\d+)$")


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    with recorded_prometheus(tmp_path_factory.mktemp("serverside-dialects")) as server:
        yield server


def samples(dialect: str, name: str, offset: int) -> list[tuple[str, float]]:
    """(labels, value) of every sample of ``name`` at the recording's time START + ``offset``."""
    start, _ = window("sglang")
    out = []
    for line in FILES[dialect].read_text().splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name and int(m.group(4)) == start + offset:
            out.append((m.group(2) or "", float(m.group(3))))
    return out


def total(dialect: str, name: str, offset: int) -> float:
    return sum(v for _, v in samples(dialect, name, offset))


def increase(dialect: str, name: str) -> float:
    return total(dialect, name, HI) - total(dialect, name, LO)


def p99(dialect: str, name: str) -> float:
    """histogram_quantile(0.99) over the stage's bucket increases, as Prometheus interpolates it."""

    def buckets(offset: int) -> dict[float, float]:
        return {float(re.search(r'le="([^"]+)"', labels).group(1)): v  # type: ignore[union-attr]
                for labels, v in samples(dialect, f"{name}_bucket", offset)}  # fmt: skip

    hi, lo = buckets(HI), buckets(LO)
    bounds = sorted(hi)
    counts = [hi[b] - lo.get(b, 0.0) for b in bounds]
    rank = 0.99 * counts[-1]
    i = next(i for i, c in enumerate(counts) if c >= rank)
    assert math.isfinite(bounds[i]), "p99 in the +Inf bucket"
    lower, below = (bounds[i - 1], counts[i - 1]) if i else (0.0, 0.0)
    return lower + (bounds[i] - lower) * (rank - below) / (counts[i] - below)


def stage(prom: PrometheusServer, dialect: str) -> dict[str, object]:
    start, _ = window(dialect)
    return figures_for_stages(prom.url, [("overload", start + LO, start + HI)])["overload"]


def test_sglang_engine_figures_from_its_series(prom: PrometheusServer) -> None:
    out = stage(prom, "sglang")
    assert out["errors"] == [] and out["window_seconds"] == SECONDS
    ttft = "sglang:time_to_first_token_seconds"
    mean_ttft = 1000 * increase("sglang", f"{ttft}_sum") / increase("sglang", f"{ttft}_count")
    assert out["server_mean_ttft_ms"] == pytest.approx(round(mean_ttft, 6), abs=1e-6)
    assert out["server_p99_ttft_ms"] == pytest.approx(round(1000 * p99("sglang", ttft), 6), abs=1e-6)
    throughput = increase("sglang", "sglang:generation_tokens_total") / SECONDS
    assert out["server_output_throughput"] == pytest.approx(round(throughput, 6), abs=1e-6)
    queue = max(total("sglang", "sglang:num_queue_reqs", t) for t in range(LO, HI + 1, 15))
    assert out["server_peak_waiting_requests"] == queue and queue > 100
    assert out["queries"] == {
        "server_mean_ttft_ms": "1000 * sum(increase(sglang:time_to_first_token_seconds_sum[90s]))"
        " / sum(increase(sglang:time_to_first_token_seconds_count[90s]))",
        "server_p99_ttft_ms": "1000 * histogram_quantile(0.99, sum by (le) "
        "(increase(sglang:time_to_first_token_seconds_bucket[90s])))",
        "server_output_throughput": "sum(increase(sglang:generation_tokens_total[90s])) / 90",
        "server_peak_waiting_requests": "max(max_over_time(sglang:num_queue_reqs[90s]))",
    }
    # No sglang counterpart in the mapping: the prefix cache's figures stay empty, never a stand-in.
    assert out["prefix_cache_hit_ratio"] is None and out["prefix_cache_hit_tokens"] is None


def test_the_same_requests_give_the_same_figures_in_both_dialects(prom: PrometheusServer) -> None:
    sglang, vllm = stage(prom, "sglang"), stage(prom, "vllm")
    assert vllm["errors"] == []
    assert vllm["queries"]["server_mean_ttft_ms"].startswith("1000 * sum(increase(vllm:")  # type: ignore[index]
    # Both measure TTFT from arrival for every request, aborted ones too; both see the same queue.
    assert sglang["server_mean_ttft_ms"] == pytest.approx(vllm["server_mean_ttft_ms"], abs=1e-6)
    assert sglang["server_peak_waiting_requests"] == vllm["server_peak_waiting_requests"]
    # vLLM counts an aborted request's output tokens too, sglang only finished requests'.
    aborted = increase("vllm", "vllm:generation_tokens_total") - increase("sglang", "sglang:generation_tokens_total")
    assert aborted > 0
    expected = float(sglang["server_output_throughput"]) + aborted / SECONDS  # type: ignore[arg-type]
    assert vllm["server_output_throughput"] == pytest.approx(expected, abs=1e-5)


def test_a_stage_outside_the_recording_has_no_figures(prom: PrometheusServer) -> None:
    """A day after the recording the same queries find nothing: each is asked at its stage's own end."""
    start, _ = window("sglang")
    out = figures_for_stages(prom.url, [("later", start + 100_000.0, start + 100_090.0)])["later"]
    assert out["server_mean_ttft_ms"] is None and out["server_peak_waiting_requests"] is None
