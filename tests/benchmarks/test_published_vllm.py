"""benchmarks/published_vllm.py: the packaged profiles' figures beside published vLLM tables, each error
(sim - published) / published of figures computed from the sim's own replays (virtual time, so exact)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import published_vllm as pub
from loadlens.contracts.gpu_profile import load_gpu_profile
from loadlens.contracts.model_profile import load_model_profile

DOCS = Path(__file__).resolve().parents[2] / "docs" / "calibration.md"
QUICK = 10.0  # modeled seconds per replayed concurrency, as --quick

# What each source's stored text shows, as entered: a changed figure is a changed citation.
PUBLISHED_FIGURES = {
    "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on": [75.0, 6.6],
    "https://buildkite.com/vllm/performance-benchmark/builds/9515": [833.53],
    "https://github.com/gpustack/gpustack/blob/main/docs/performance-lab/qwen3-8b/h100-latency.md": [
        60.26, 7.37, 496.88, 1680.0,
    ],
    "https://github.com/QwenLM/Qwen2.5/blob/a912d239c2d0e2e5d10bb8d02e6f5685edb43e68/docs/source/benchmark/"
    "speed_benchmark.rst": [84.28, 80.70, 77.69, 70.33],
    "https://github.com/QwenLM/Qwen2.5/blob/4da996c576418cc9ecdff35aeddfcdca814e9568/docs/source/benchmark/"
    "speed_benchmark.rst": [80.45, 76.41, 66.54, 55.83],
}  # fmt: skip


def test_every_source_is_cited_with_its_figures_and_profiles_that_load() -> None:
    assert {p.source: [f.published for f in p.figures] for p in pub.PUBLISHED} == PUBLISHED_FIGURES
    for p in pub.PUBLISHED:
        assert p.title and p.model and p.gpu and p.vllm and p.load and p.note
        assert all(f.how for f in p.figures)
        load_model_profile(p.model_profile)
        load_gpu_profile(p.gpu_profile)


@pytest.mark.timeout(300)  # replays in virtual time: a few CPU seconds, more on a loaded 2-core machine
@pytest.mark.parametrize(
    "source", pub.PUBLISHED, ids=lambda p: f"{p.model_profile}@{p.gpu_profile}:{p.vllm.split()[0]}"
)
def test_each_source_replays_its_load_in_quick_mode(source: pub.Published) -> None:
    result = pub.compare(source, seconds=QUICK)
    replays = result["replays"]
    assert isinstance(replays, dict)
    assert list(replays) == [load.label for load in source.loads]
    for figures in replays.values():
        assert figures["completed"] and figures["completed"] > 0
    rows = result["figures"]
    assert isinstance(rows, list) and [r["figure"] for r in rows] == [f.name for f in source.figures]
    for row, figure in zip(rows, source.figures, strict=True):
        assert row["published"] == figure.published
        assert row["sim"] is not None and row["sim"] == figure.sim(replays)
        assert row["error"] == (row["sim"] - row["published"]) / row["published"]
    # virtual time: the same replay gives the same figures to the last bit
    assert pub.compare(source, seconds=QUICK) == result


def test_the_a100_figures_are_the_sims_decode_rate_and_batching_gain() -> None:
    result = pub.compare(pub.MUSGRAVE_A100, seconds=QUICK)
    replays = result["replays"]
    one, eight = replays[pub.A100_C1.label], replays[pub.A100_C8.label]  # type: ignore[index]
    decode, ratio = result["figures"]  # type: ignore[misc]
    assert decode["sim"] == 1000.0 / one["median_itl_ms"]
    assert ratio["sim"] == eight[pub.RATE] / one[pub.RATE]
    # the replays ran the source's load: one request at a time at C=1; at C=8 at most 8 running (the rest of the
    # eight queue while a 1,024-token prompt is prefilled). Little's law over a window whose edges cut requests.
    assert round(one["mean_running"]) == 1 and 1 < eight["mean_running"] <= 8


def test_the_batch_of_eight_stays_in_step() -> None:
    """The latency test times one batch of 8; the sim's 8 closed-loop users must finish together for one
    request's E2E to stand for the batch's: their P99 E2E equals their median."""
    (eight,) = pub.compare(pub.VLLM_CI_H200, seconds=QUICK)["replays"].values()  # type: ignore[attr-defined]
    assert eight["p99_e2el_ms"] == pytest.approx(eight["median_e2el_ms"], rel=1e-9)


@pytest.mark.timeout(300)
def test_a_speed_is_the_output_over_one_whole_request() -> None:
    """Qwen's speed benchmark: 2,048 tokens over the whole generate call; the window is long enough for a
    request of 30,720 prompt tokens to be measured even in quick mode."""
    result = pub.compare(pub.QWEN25_A100, seconds=QUICK)
    for load, row in zip(pub.QWEN_SPEED_LOADS, result["figures"], strict=True):  # type: ignore[call-overload]
        figures = result["replays"][load.label]  # type: ignore[index]
        # one user: never two requests at once (Little's law over a window whose edges cut requests)
        assert figures["completed"] >= 1 and 0 < figures["mean_running"] <= 1
        assert row["sim"] == 2048 / (figures["median_e2el_ms"] / 1000)


@pytest.mark.timeout(300)  # every source at 60 (or 90) modeled seconds: about 6 CPU seconds
def test_the_docs_carry_the_current_tables(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/calibration.md section 6 holds the output of ``--markdown`` (60 modeled seconds): every line of it."""
    assert pub.main(["--markdown"]) == 0
    docs = DOCS.read_text()
    missing = [line for line in capsys.readouterr().out.splitlines() if line and line not in docs]
    assert missing == [], "rerun python -m benchmarks.published_vllm --markdown into docs/calibration.md"


@pytest.mark.timeout(300)
def test_main_writes_json_and_refuses_a_zero_duration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "published.json"
    assert pub.main(["--quick", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert [r["source"] for r in written] == [p.source for p in pub.PUBLISHED]
    printed = capsys.readouterr().out
    assert all(p.title in printed for p in pub.PUBLISHED)
    assert "decode tokens/s of one request at C=1" in printed
    with pytest.raises(SystemExit) as exc:
        pub.main(["--seconds", "0"])
    assert exc.value.code == 2
