"""``loadlens calibrate`` end to end on a sweep result written from known-answer stages, and its one-line
errors (exit 2) for unusable input."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from exporters.serving.calibrate.cli import MAX_REPLAYS, REPLAY_REQUESTS, replays
from exporters.serving.calibrate.frontend_fit import SPLIT
from exporters.serving.calibrate.observations import Stage
from exporters.serving.calibrate.ranks import PERCENTILES
from exporters.serving.calibrate.step_drift import Drift, StepDrift
from loadlens.cli import main
from loadlens.contracts.gpu_profile import load_gpu_profile
from tests.calibrate.known import MODEL, experiment_doc, hidden_profile, observe

STAGES = ["c1-p240", "c6-p240", "p40-c2", "p600-c2", "p360-c4"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("sweep")
    stages = observe(hidden_profile(tmp), STAGES)
    (tmp / "experiment_result.json").write_text(json.dumps(experiment_doc(stages)))
    return tmp


def test_calibrate_writes_a_profile_and_prints_every_stage(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, report = tmp_path / "fitted.yaml", tmp_path / "report.json"
    code = main(["calibrate", "--replays", "1", str(sweep), "--model-profile", str(MODEL), "--profile", str(out),
                 "--hold-out", "p360-c4", "--json", str(report)])  # fmt: skip
    assert code == 0
    profile = load_gpu_profile(str(out))
    assert profile.name == "fitted" and profile.layer_overhead_seconds == 0.0
    assert profile.default_knobs["insertion_overhead_us"] > 0
    # The KV capacity is the one the (sim) server stated in its vllm:cache_config_info, carried over in tokens.
    stated = observe(hidden_profile(tmp_path), STAGES[:1])[0].kv_capacity
    assert stated is not None and stated.block_size == 16
    assert profile.default_knobs["num_gpu_blocks"] == stated.blocks
    assert profile.frontend_fixed_seconds > 0 and profile.frontend_per_running_seconds > 0
    # No scheduler limits given: the base profile's (h100-sxm: vLLM's defaults on that card), said so.
    assert (profile.default_knobs["max_num_seqs"], profile.default_knobs["max_num_batched_tokens"]) == (1024, 8192)
    doc = json.loads(report.read_text())
    assert doc["scheduler"] == {
        "max_num_seqs": 1024,
        "max_num_batched_tokens": 8192,
        "async_scheduling": False,
        "source": "the base profile h100-sxm's: vLLM does not export them, so pass the server's with "
        "--max-num-seqs and --max-num-batched-tokens",
        "async_scheduling_source": "the base profile h100-sxm's",
    }
    assert profile.default_knobs["async_scheduling"] is False
    assert [r["stage"] for r in doc["predictions"]] == STAGES
    assert [r["set"] for r in doc["predictions"]] == ["fit"] * 4 + ["held-out"]
    assert set(doc["not_identified"]) == {"s_per_byte"}
    assert [r["start"] for r in doc["regimes"]["starts"]] == [
        "every step compute-bound", "decode-only steps memory-bound", "every step memory-bound"]  # fmt: skip
    assert doc["regimes"]["memory_bound_steps"] == 0 and doc["regimes"]["close"] == []  # compute-bound, clearly
    assert doc["kv_capacity"] == {
        "blocks": stated.blocks,
        "block_size": 16,
        "sim_num_gpu_blocks": stated.blocks,
        "reason": f"stated by the server: {stated.blocks} blocks of 16 tokens = {stated.tokens} tokens, "
        f"{stated.blocks} of the sim's 16-token blocks",
    }
    # The known sweep's "server" had no host between its engine and its client: little delivery noise found.
    assert set(doc["delivery_noise"]) == {"mean_s", "per_stage_s", "model"}
    assert set(doc["delivery_noise"]["per_stage_s"]) == set(STAGES) - {"p360-c4"}
    assert 0 <= doc["delivery_noise"]["mean_s"] < 0.0001
    for row in doc["predictions"]:
        assert set(row["ranks"]) == set(PERCENTILES)
        assert all(0 <= r["rank"] <= 1 and r["samples"] > 0 for r in row["ranks"].values())
    printed = capsys.readouterr().out
    assert "s_per_byte       not identified: no step of the data is bound by this term" in printed
    assert "per stage, where each real client percentile falls in the sim's distribution" in printed
    assert f"(frontend_fixed_s: {SPLIT})" in printed
    assert [r["stage"] for r in doc["frontend_rows"]] == STAGES[:4]
    assert "worst |error| over held-out stages:" in printed
    # The replay's prompts are each its own: the (sim) server looked every prompt up and found none cached.
    assert doc["prefix_cache_hit_ratio"] == dict.fromkeys(STAGES, 0.0)
    assert doc["warnings"] == []


def test_a_stage_whose_prompts_were_cached_is_warned_about(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stage whose prompts the server had seen before: its prefills were shorter than its prompts, which the
    fit prices as computed (docs/calibration.md, section 1)."""
    doc = json.loads((sweep / "experiment_result.json").read_text())
    counters = doc["trials"][1]["runs"][0]["server"]["engine_counters"]
    counters["vllm:prefix_cache_hits_total"] = 0.3 * counters["vllm:prefix_cache_queries_total"]
    path = tmp_path / "cached.json"
    path.write_text(json.dumps(doc))
    report = tmp_path / "report.json"
    code = main(["calibrate", "--replays", "1", str(path), "--model-profile", str(MODEL), "--profile",
                 str(tmp_path / "p.yaml"),
                 "--no-predict", "--json", str(report)])  # fmt: skip
    assert code == 0
    line = (
        f"stage {STAGES[1]}: 30.0 % of its prompt tokens came from the server's prefix cache, where the fit prices "
        "every prompt token as computed (its prompts were sent before: rerun the sweep with another --run-id or "
        "--seed, or against a restarted server)"
    )
    assert f"calibrate: warning: {line}" in capsys.readouterr().err.splitlines()
    written = json.loads(report.read_text())
    assert written["warnings"] == [line]
    assert written["prefix_cache_hit_ratio"][STAGES[1]] == pytest.approx(0.3)


@pytest.mark.timeout(90)  # four fits with replays: 14 s in the parallel phase, x5 (tests/support/timeout_margins.py)
def test_the_servers_scheduler_limits_go_into_the_profile_and_the_replay(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, report = tmp_path / "fitted.yaml", tmp_path / "report.json"
    code = main(["calibrate", "--replays", "1", str(sweep), "--model-profile", str(MODEL), "--profile", str(out),
                 "--no-predict",
                 "--max-num-seqs", "128", "--max-num-batched-tokens", "2048", "--no-delivery-noise",
                 "--async-scheduling", "--json", str(report)])  # fmt: skip
    assert code == 0
    knobs = load_gpu_profile(str(out)).default_knobs
    assert (knobs["max_num_seqs"], knobs["max_num_batched_tokens"], knobs["async_scheduling"]) == (128, 2048, True)
    assert json.loads(report.read_text())["delivery_noise"] == {
        "mean_s": 0.0, "per_stage_s": {}, "model": "none (--no-delivery-noise)"}  # fmt: skip
    assert json.loads(report.read_text())["scheduler"] == {
        "max_num_seqs": 128, "max_num_batched_tokens": 2048, "async_scheduling": True,
        "source": "given (--max-num-seqs, --max-num-batched-tokens)", "async_scheduling_source": "given",
    }  # fmt: skip
    line = "scheduler limits: max_num_seqs 128, max_num_batched_tokens 2048 (given (--max-num-seqs, "
    printed = capsys.readouterr().out.splitlines()
    assert line + "--max-num-batched-tokens)); async scheduling on (given)" in printed
    assert ("delivery noise (the host's delay between the engine and the client; the replay adds it; not in the "
            "profile): none (--no-delivery-noise)") in printed  # fmt: skip
    # One given, the other the base profile's.
    code = main(["calibrate", "--replays", "1", str(sweep), "--model-profile", str(MODEL), "--profile", str(out),
                 "--no-predict",
                 "--max-num-batched-tokens", "4096", "--json", str(report)])  # fmt: skip
    assert code == 0
    assert json.loads(report.read_text())["scheduler"] == {
        "max_num_seqs": 1024, "max_num_batched_tokens": 4096, "async_scheduling": False,
        "source": "--max-num-batched-tokens given, the other the base profile h100-sxm's",
        "async_scheduling_source": "the base profile h100-sxm's",
    }  # fmt: skip
    # A step budget too small to bite does not change the replay; one that chunks every prompt does.
    small = tmp_path / "small.json"
    code = main(["calibrate", "--replays", "1", str(sweep), "--model-profile", str(MODEL), "--profile",
                 str(tmp_path / "s.yaml"),
                 "--max-num-seqs", "16", "--max-num-batched-tokens", "64", "--json", str(small)])  # fmt: skip
    assert code == 0
    big = tmp_path / "big.json"
    code = main(["calibrate", "--replays", "1", str(sweep), "--model-profile", str(MODEL), "--profile",
                 str(tmp_path / "b.yaml"),
                 "--json", str(big)])  # fmt: skip
    assert code == 0

    def ttft(path: Path, stage: str) -> float:
        (row,) = [r for r in json.loads(path.read_text())["predictions"] if r["stage"] == stage]
        return float(row["sim"]["median_ttft_ms"])

    # p600-c2's 600-token prompts take ten 64-token steps each: its first token comes later.
    assert ttft(small, "p600-c2") > ttft(big, "p600-c2")


def _logged_run(sweep: Path, tmp: Path) -> tuple[list[str], Path, Path]:
    """A calibrate command (no prediction) with a vLLM log: the known sweep's runs span seconds 0 to 4 of the
    epoch, and the log holds 2.0 and 2.4 ms single decodes alike in its second 1 (read in this host's zone), 40
    in each of the five stages' runs. Returns the command, the profile it writes and its JSON report."""
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(1.0))
    line = (f"(APIServer pid=1) INFO {stamp} [loggers.py:199] Engine 000: Iteration(1): 0 context requests, 0 "
            "context tokens, 1 generation requests, 1 generation tokens, iteration elapsed time: {ms} ms")  # fmt: skip
    log = tmp / "vllm.log"
    log.write_text("\n".join(line.format(ms=ms) for ms in ("2.0", "2.4") * 20) + "\n")
    out, report = tmp / "fitted.yaml", tmp / "report.json"
    argv = ["calibrate", "--replays", "1", str(sweep), "--model-profile", str(MODEL), "--profile", str(out),
            "--no-predict", "--no-delivery-noise", "--json", str(report), "--iteration-log", str(log)]  # fmt: skip
    return argv, out, report


def test_the_logged_steps_spread_goes_into_the_profile(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each of the five stages one group of 40 single decodes, 0.2 ms either side of their mean.
    base, out, report = _logged_run(sweep, tmp_path)
    assert main(base) == 0
    assert load_gpu_profile(str(out)).step_spread_seconds == (-0.0002,) * 25 + (0.0002,) * 25
    assert json.loads(report.read_text())["step_spread"] == {
        "values": [-0.0002] * 25 + [0.0002] * 25, "steps": 200, "groups": 5}  # fmt: skip
    assert ("step spread (vLLM's logged steps around their mean; in the profile): 200 decode-only steps in 5 "
            "(stage, batch) groups, each against its group's mean, ms: P10 -0.20, P50 +0.20, P90 +0.20, P99 +0.20; "
            "the sim adds one of its 50 values to each step") in capsys.readouterr().out.splitlines()  # fmt: skip
    assert main([*base, "--no-step-spread"]) == 0
    assert load_gpu_profile(str(out)).step_spread_seconds == ()
    assert json.loads(report.read_text())["step_spread"] is None
    assert "step spread" not in capsys.readouterr().out


def test_the_logged_decode_step_by_batch_goes_into_the_profile(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 40 single decodes in each of the five stages' runs, 2.2 ms on average, against the fit's step.
    base, out, report = _logged_run(sweep, tmp_path)
    assert main(base) == 0
    written = json.loads(report.read_text())["decode_step_offsets"]
    assert written["steps"] == {"1": 200} and len(written["values"]) == 1
    assert load_gpu_profile(str(out)).decode_step_offsets_seconds == tuple(written["values"])
    printed = [x for x in capsys.readouterr().out.splitlines() if x.startswith("decode step by batch")]
    assert printed == [
        "decode step by batch (vLLM's logged decode-only steps; in the profile): ms against the fitted step, 200 "
        f"decode-only steps: b1 {written['values'][0] * 1000:+.2f}; the sim adds each to its decode-only steps of "
        "that batch"
    ]
    assert main([*base, "--no-decode-offsets"]) == 0
    assert load_gpu_profile(str(out)).decode_step_offsets_seconds == ()
    assert load_gpu_profile(str(out)).step_spread_seconds != ()  # the spread stays
    assert json.loads(report.read_text())["decode_step_offsets"] is None
    assert "decode step by batch" not in capsys.readouterr().out


def test_the_logged_steps_drift_is_reported_per_stage(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The same 40 single decodes in each of the five stages' runs: each stage against the other fitted ones.
    base, _, report = _logged_run(sweep, tmp_path)
    assert main([*base, "--hold-out", "p360-c4"]) == 0
    drift = json.loads(report.read_text())["step_drift"]
    assert {name: (d["steps"], d["held_out"]) for name, d in drift.items()} == {
        "c1-p240": (40, False), "c6-p240": (40, False), "p40-c2": (40, False), "p600-c2": (40, False),
        "p360-c4": (40, True),
    }  # fmt: skip
    shown = StepDrift({name: Drift(d["ratio"], d["steps"], d["held_out"]) for name, d in drift.items()})
    printed = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step drift")]
    want = f"step drift (each stage's logged decode steps against the other fitted stages'): {shown.note()}"
    assert printed == [want]


def _code_and_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err.strip().splitlines()[-1]


def test_unusable_input_exits_2_with_one_line(sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model-profile", str(MODEL), "--profile", str(tmp_path / "p.yaml")]
    doc = json.loads((sweep / "experiment_result.json").read_text())

    def write(name: str, body: object) -> str:
        path = tmp_path / name
        path.write_text(json.dumps(body))
        return str(path)

    no_stages = write("none.json", {**doc, "trials": []})
    assert _code_and_error(["calibrate", "--replays", "1", no_stages, *base], capsys) == (
        2, f"loadlens calibrate: error: {no_stages}: no finished stage (no trial with a completed run)")  # fmt: skip
    bare = json.loads(json.dumps(doc))
    for trial in bare["trials"]:
        trial["runs"][0]["server"]["engine_counters"] = {}
    assert _code_and_error(["calibrate", "--replays", "1", write("bare.json", bare), *base], capsys) == (
        2,
        "loadlens calibrate: error: stage c1-p240: no server series (vllm:inter_token_latency_seconds and "
        "vllm:request_prefill_time_seconds increases); run the sweep against a server exporting vLLM's /metrics",
    )
    few = json.loads(json.dumps(doc))
    few["trials"][1]["runs"][0]["figures"]["completed"] = 12
    assert _code_and_error(["calibrate", "--replays", "1", write("few.json", few), *base], capsys) == (
        2, "loadlens calibrate: error: stage c6-p240: 12 completed requests, too few (at least 20)")  # fmt: skip
    missing = tmp_path / "no-such-vllm.log"
    assert _code_and_error(
        ["calibrate", "--replays", "1", str(sweep), *base, "--iteration-log", str(missing)], capsys
    ) == (
        2,
        f"loadlens calibrate: error: --iteration-log {missing}: cannot read it (No such file or directory)",
    )
    bench = write("benchmark_result.json", {"run": {}, "stages": [], "overall": {}})
    assert _code_and_error(["calibrate", "--replays", "1", bench, *base], capsys)[1].endswith(
        "a benchmark_result.json carries no server counters; give --prometheus URL (the Prometheus that scraped "
        "the server during the run) or --metrics-before/--metrics-after (the server's /metrics saved before and "
        "after it), or calibrate from loadlens experiment calibration-sweep")  # fmt: skip
    assert _code_and_error(["calibrate", "--replays", "1", bench, *base, "--prometheus", "http://127.0.0.1:9"],
                            capsys)[1].endswith(
        "not a loadlens benchmark_result.json (schema is not loadlens.benchmark_result)")  # fmt: skip
    assert _code_and_error(
        ["calibrate", "--replays", "1", str(sweep), *base, "--max-num-seqs", "64", "--max-num-batched-tokens", "32"],
        capsys,
    ) == (  # fmt: skip
        2,
        "loadlens calibrate: error: --max-num-batched-tokens 32 is below max_num_seqs 64 (vLLM refuses that too)",
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", "--replays", "1", str(sweep), *base, "--max-num-seqs", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "argument --max-num-seqs: must be at least 1, got 0")  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", "--replays", "1", str(sweep), *base, "--replays", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("argument --replays: must be at least 1, got 0")
    assert _code_and_error(["calibrate", "--replays", "1", str(sweep), *base, "--hold-out", "c9"], capsys) == (
        2, "loadlens calibrate: error: --hold-out c9: no such stage (stages: c1-p240, c6-p240, p360-c4, p40-c2, "
        "p600-c2)")  # fmt: skip


def test_a_stage_is_replayed_for_enough_requests_or_as_told_never_fewer_than_its_runs() -> None:
    def stage(completed: int, runs: int) -> Stage:
        return Stage("s", 4, 240, 128, 20.0, completed, runs=runs)

    assert replays(stage(90, 3), None) == MAX_REPLAYS  # 30 requests a run: 100 replays wanted, at most 24
    assert replays(stage(2 * REPLAY_REQUESTS, 2), None) == 2  # a run of 3,000 requests: its runs
    assert replays(stage(3 * REPLAY_REQUESTS // 10, 1), None) == 4  # 900: ceil(3000 / 900)
    assert replays(stage(0, 1), None) == MAX_REPLAYS
    assert (replays(stage(90, 3), 1), replays(stage(90, 3), 5)) == (3, 5)
