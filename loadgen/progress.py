"""The progress line printed every ``--progress-interval`` seconds (master or local process)."""

from __future__ import annotations

from loadgen.profile import Stage
from loadgen.store import Store


def progress_line(stage: Stage, elapsed: float, store: Store, users: int, cpu_ratio: float) -> str:
    """Stage so far: finished requests and streamed tokens per second, TTFT p99, ITL p50, CPU."""
    elapsed = max(1e-6, elapsed)
    series = store.merged([k for k in store.series if k[0] == stage.name])
    ttft = series.dists["ttft"]
    itl = series.dists["itl"]
    planned = f"/{stage.duration:.0f}s" if stage.duration is not None else f" until {stage.until_requests} req"
    ttft_txt = f"{ttft.quantile(0.99) * 1e3:.1f}ms" if ttft.count else "-"
    itl_txt = f"{itl.quantile(0.5) * 1e3:.2f}ms" if itl.count else "-"
    tokens = store.window_tokens.get(stage.name, 0)
    return (
        f"loadgen: [{stage.name} {elapsed:.0f}s{planned}] users={users} "
        f"req/s={(series.completed + series.failed) / elapsed:.1f} out_tok/s={tokens / elapsed:.0f} "
        f"ttft_p99={ttft_txt} itl_p50={itl_txt} ok={series.completed} failed={series.failed} "
        f"cpu={cpu_ratio:.0%}"
    )
