"""The proxy's swap feed from the upstream's probe documents: unit behaviour, and blocking attribution of
on-demand loads the proxy never saw, against the sim's ground truth.

Documents are written by the real probe (``exporters.probe.Probe``) over a fake torch, as the vLLM plugin's
probe writes them in a GPU worker.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.probe import Probe
from exporters.serving.app import ServeSettings, create_app
from exporters.serving.engines.openai.engine import OpenAIProxyEngine
from exporters.serving.engines.openai.probe_swap_feed import ProbeSwapFeed
from exporters.serving.engines.openai.swap_windows import SwapWindows
from exporters.serving.tracing import Tracing
from tests.probe.fakes import MIB, FakeCuda, fake_torch, stats
from tests.serving.swap_rig import Stream, advance, blocking_sim, total, write_adapter
from tests.support.server import serve_app

WALL0, MONO0 = 1_800_000_000.0, 5_000.0  # the fake clocks: Unix time WALL0 is monotonic MONO0


def _probe(directory: Path, hostname: str, role: str = "vllm-worker") -> Probe:
    # Two writers in one test process share its pid: they differ by hostname (the file) and role (the reader
    # keeps one document per process and role).
    cuda = FakeCuda({0: stats(16 * MIB, 2 * MIB, 1_000_000)}, [])
    return Probe(role, directory, fake_torch(cuda), hostname=hostname, clock=time.time)


def _value(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float | None:
    return registry.get_sample_value(name, labels or {})


def _feed(
    directory: Path, windows: SwapWindows, registry: CollectorRegistry, hostname: str | None = None
) -> ProbeSwapFeed:
    return ProbeSwapFeed(
        directory, windows, registry=registry, hostname=hostname, wall=lambda: WALL0 + 10.0, mono=lambda: MONO0 + 10.0
    )


def test_loads_become_windows_on_the_monotonic_clock_once_each(tmp_path: Path) -> None:
    probe = _probe(tmp_path, "vllm-0")
    probe.record_lora_load("sql-lora", 8, WALL0 + 1.0, WALL0 + 1.25, on_demand=True)
    probe.record_lora_load("chat-lora", 16, WALL0 + 2.0, WALL0 + 2.5, on_demand=False)
    probe.write_now()
    windows, registry = SwapWindows(), CollectorRegistry()
    feed = _feed(tmp_path, windows, registry)
    assert feed.poll_once() == 2
    assert [(w.adapter, w.operation, w.start, w.end) for w in windows.snapshot()] == [
        ("sql-lora", "load", MONO0 + 1.0, MONO0 + 1.25),
        ("chat-lora", "load", MONO0 + 2.0, MONO0 + 2.5),
    ]
    assert feed.poll_once() == 0  # the same document again: nothing new
    probe.record_lora_load("sql-lora", 8, WALL0 + 3.0, WALL0 + 3.125, on_demand=True)
    probe.write_now()
    assert feed.poll_once() == 1
    assert len(windows) == 3
    assert _value(registry, "loadlens_proxy_probe_swap_windows_total", {"on_demand": "true"}) == 2.0
    assert _value(registry, "loadlens_proxy_probe_swap_windows_total", {"on_demand": "false"}) == 1.0
    assert _value(registry, "loadlens_proxy_probe_swap_feed_failures_total") == 0.0
    probe.stop()


def test_hostname_keeps_other_servers_documents_out(tmp_path: Path) -> None:
    mine, other = _probe(tmp_path, "pod-a"), _probe(tmp_path, "pod-b", role="vllm-worker-b")
    mine.record_lora_load("a", 8, WALL0 + 1.0, WALL0 + 1.5, on_demand=True)
    other.record_lora_load("b", 8, WALL0 + 1.0, WALL0 + 1.5, on_demand=True)
    mine.write_now()
    other.write_now()
    windows = SwapWindows()
    assert _feed(tmp_path, windows, CollectorRegistry(), hostname="pod-a").poll_once() == 1
    assert [w.adapter for w in windows.snapshot()] == ["a"]
    every = SwapWindows()
    assert _feed(tmp_path, every, CollectorRegistry()).poll_once() == 2
    mine.stop()
    other.stop()


def test_bad_files_and_a_missing_directory_never_fail(tmp_path: Path) -> None:
    (tmp_path / "probe-x-1.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "probe-x-2.json").write_text(json.dumps({"version": 99}), encoding="utf-8")
    windows, registry = SwapWindows(), CollectorRegistry()
    assert _feed(tmp_path, windows, registry).poll_once() == 0
    assert _feed(tmp_path / "absent", windows, CollectorRegistry()).poll_once() == 0
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("", encoding="utf-8")
    failing = CollectorRegistry()
    assert _feed(not_a_dir, windows, failing).poll_once() == 0
    assert _value(failing, "loadlens_proxy_probe_swap_feed_failures_total") == 1.0
    assert len(windows) == 0


def test_the_thread_polls_until_stopped(tmp_path: Path) -> None:
    windows = SwapWindows()
    feed = ProbeSwapFeed(tmp_path, windows, registry=CollectorRegistry(), poll_interval_s=0.02).start()
    try:
        probe = _probe(tmp_path, "vllm-0")
        before = time.monotonic()
        now = time.time()
        probe.record_lora_load("late", 8, now - 0.5, now - 0.25, on_demand=True)
        probe.write_now()
        deadline = time.monotonic() + 30
        while not len(windows):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        seen = time.monotonic()
        (w,) = windows.snapshot()
        assert w.end - w.start == pytest.approx(0.25, abs=1e-6)
        # Converted onto this clock: ``now`` was read after ``before``, and the poll that found the document
        # read its clocks after it was written and before the window was seen (1e-6: a Unix time's float step).
        assert before - 0.25 - 1e-6 <= w.end <= seen - 0.25 + 1e-6
        probe.stop()
    finally:
        feed.stop()
    with pytest.raises(ValueError, match="poll interval"):
        ProbeSwapFeed(tmp_path, windows, poll_interval_s=0)


N = 6
PROGRESS = 20  # tokens every stream gets between two loads (~0.1 s of decode)


@pytest.mark.slow
def test_loads_the_proxy_never_forwarded_are_attributed_from_the_probe(tmp_path: Path) -> None:
    """Adapters are loaded on the sim directly (as vLLM loads one on demand inside its worker): the proxy sees
    no call. A stand-in for the vLLM plugin records each of the sim's loop-blocking windows into a real probe,
    the proxy's feed reads the probe directory, and the proxy's blocking must match the sim's ground truth."""
    root, probe_dir = tmp_path / "adapters", tmp_path / "probe"
    write_adapter(root, "a1")
    write_adapter(root, "a2")
    sim_registry, proxy_registry = CollectorRegistry(), CollectorRegistry()
    sim = blocking_sim(sim_registry)
    probe = Probe("vllm-worker", probe_dir, fake_torch(FakeCuda({}, [])), hostname="vllm-0", interval=60.0)
    probe.start()
    # Unix time is this process's monotonic clock plus one offset, read once: the stand-in plugin stamps with it
    # and the feed converts back with it. Reading the two clocks anew each time, a thread switch between the reads
    # (this process runs a dozen threads) would shift a window by milliseconds, past the next token.
    offset = time.time() - time.monotonic()
    blocked_on = sim._live.charge_block
    sim_windows: list[tuple[float, float]] = []
    emitted: list[dict[int, int]] = []  # per load: tokens each request (by max_tokens) had emitted when it began

    def charge_block(start: float, end: float) -> None:  # what the plugin's add_adapter wrapper records
        blocked_on(start, end)
        sim_windows.append((start, end))
        emitted.append({live.max_tokens: live.sched.num_output for live in sim._live})
        probe.record_lora_load(f"a{len(sim_windows)}", 256, start + offset, end + offset, on_demand=True)

    sim._live.charge_block = charge_block  # type: ignore[method-assign]
    sim_app = create_app(
        sim, ServeSettings(admin_token="t", lora_root=root), registry=sim_registry, tracing=Tracing.disabled()
    )
    with serve_app(sim_app) as sim_url:
        proxy = OpenAIProxyEngine(sim_url, api_key="t")
        feed = ProbeSwapFeed(
            probe_dir,
            proxy.swap_windows,
            registry=proxy_registry,
            hostname="vllm-0",
            wall=lambda: offset,
            mono=lambda: 0.0,
        ).start()
        proxy_app = create_app(proxy, ServeSettings(), registry=proxy_registry, tracing=Tracing.disabled())
        try:
            with serve_app(proxy_app) as proxy_url:
                # Distinct lengths tell the sim's requests apart; each has ~500 tokens (~2.5 s) left after the
                # last load, far more than the feed needs to read the window (a poll, 0.2 s).
                streams = [Stream(proxy_url, 600 + i) for i in range(N)]
                for s in streams:
                    s.start()
                advance(streams, 1 + PROGRESS)
                with httpx.Client(base_url=sim_url, headers={"Authorization": "Bearer t"}, timeout=30) as admin:
                    for name in ("a1", "a2"):
                        response = admin.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": name})
                        assert response.status_code == 200
                        advance(streams, PROGRESS)  # decoding resumed: the next load is a stall of its own
                for s in streams:
                    s.join(60)
                assert [s.error for s in streams] == [None] * N
                assert [len(s.times) for s in streams] == [s.max_tokens for s in streams]
        finally:
            feed.stop()
            probe.stop()

    assert len(sim_windows) == 2
    loads = [(w.adapter, w.operation) for w in proxy.swap_windows.snapshot()]
    assert loads == [("a1", "load"), ("a2", "load")]  # from the probe alone: the proxy forwarded no call
    sim_sum = total(sim_registry, "loadlens_lora_swap_blocking_seconds_sum")
    proxy_sum = total(proxy_registry, "loadlens_lora_swap_blocking_seconds_sum")
    sim_delayed = total(sim_registry, "loadlens_lora_swap_delayed_requests_total")
    proxy_delayed = total(proxy_registry, "loadlens_lora_swap_delayed_requests_total")
    window_sum = sum(end - start for start, end in sim_windows)
    # Same windows on both sides. Per request and load the proxy charges from the later of the window's start
    # and the arrival of the request's last token before it (the sim's from the start): less by that token's
    # hop, which is no later than when this test's client got the token (the proxy forwards it after stamping).
    hop = sum(
        max(0.0, s.times[counts[s.max_tokens] - 1] - start)
        for (start, _), counts in zip(sim_windows, emitted, strict=True)
        for s in streams
    )
    # The probe document carries Unix times (~1.8e9 s, a float's step there is 2.4e-7 s): converting a window
    # there and back moves each of its ends by half a step at most.
    rounding = N * len(sim_windows) * 2.4e-7
    print(f"\nsim={sim_sum:.4f} proxy={proxy_sum:.4f} windows={window_sum:.4f} hop={hop:.4f} delayed={sim_delayed}")
    assert sim_sum == pytest.approx(N * window_sum, abs=1e-9)
    assert sim_delayed == proxy_delayed == N
    assert -rounding <= sim_sum - proxy_sum <= hop + rounding
