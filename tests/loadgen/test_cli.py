"""`loadlens load` arguments: env variables, exit 2 with the field for bad input, fast failure for a dead target."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from loadgen.cli import build_command
from loadlens.cli import build_parser
from loadlens.util.net import free_port
from tests.loadgen.conftest import ROOT, loadlens, run_child, write_profile


def load_parser() -> Any:
    parser = build_parser()
    sub: Any = parser._subparsers._group_actions[0]  # type: ignore[union-attr]
    return sub.choices["load"]


def test_every_flag_has_its_env_variable() -> None:
    load = load_parser()
    flags = [a for a in load._actions if a.option_strings and a.dest not in ("help", "list_profiles")]
    assert {a.dest for a in flags} >= {
        "profile", "host", "model", "headless", "users_scale", "time_scale", "results", "prometheus", "seed",
    }  # fmt: skip
    for action in flags:
        assert f"[env: LOADLENS_LOAD_{action.dest.upper()}]" in action.help, action.dest


def test_env_sets_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADLENS_LOAD_PROFILE", "burst")
    monkeypatch.setenv("LOADLENS_LOAD_TIME_SCALE", "0.5")
    monkeypatch.setenv("LOADLENS_LOAD_LOG_LEVEL", "INFO")  # lower case is the spelling; upper case works too
    args = build_parser().parse_args(["load"])
    assert (args.profile, args.time_scale, args.log_level) == ("burst", 0.5, "info")


def test_locust_command_line() -> None:
    args = build_parser().parse_args(
        ["load", "--host", "http://h:1/v1/", "--headless", "--workers", "2", "--csv", "--html", "--seed", "7"]
    )
    assert args.host == "http://h:1/v1"
    cmd = build_command(args, Path("p.yaml"), "m", "run1")
    assert cmd[1:3] == ["-m", "locust"] and "--headless" in cmd
    joined = " ".join(cmd)
    assert "--processes 2" in joined and "--model m" in joined and "--seed 7" in joined
    assert "--csv results/run1/locust" in joined and "--html results/run1/locust_report.html" in joined
    # Local worker processes meet their master on a free loopback port of this run's own, never Locust's 5557.
    port = cmd[cmd.index("--master-bind-port") + 1]
    assert port != "5557" and cmd[cmd.index("--master-port") + 1] == port
    assert cmd[cmd.index("--master-bind-host") + 1] == "127.0.0.1"
    named = build_command(
        build_parser().parse_args(["load", "--workers", "2", "--master-port", "6000"]), Path("p"), None, "r"
    )
    assert named[named.index("--master-bind-port") + 1] == named[named.index("--master-port") + 1] == "6000"
    worker = build_command(build_parser().parse_args(["load", "--master-host", "10.0.0.1"]), Path("p"), None, "r")
    assert "--worker" in worker and "--headless" not in worker
    assert worker[worker.index("--master-port") + 1] == "5557"
    master = build_command(build_parser().parse_args(["load", "--expect-workers", "3"]), Path("p"), None, "r")
    assert master[master.index("--master-bind-port") + 1] == "5557"


def test_invalid_profile_exits_2_naming_the_field(tmp_path: Path) -> None:
    bad = write_profile(
        tmp_path / "bad.yaml", {"traffic": [{"name": "a"}], "stages": [{"name": "s", "users": 0, "duration": 1}]}
    )
    line = bad.read_text().splitlines().index("  users: 0") + 1
    proc = run_child(loadlens("--profile", str(bad), "--headless"), timeout=20)
    assert proc.returncode == 2
    assert proc.stdout.strip().splitlines()[-1] == (
        f"loadlens load: error: profile bad.yaml:{line}:3: stages[0].users: must be >= 1, got 0"
    )


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--profile", "nope"], "unknown profile 'nope'"),
        (["--host", "localhost:8000"], "must be an http(s) URL"),
        (["--time-scale", "0"], "must be a positive finite number"),
        (["--workers", "2", "--expect-workers", "2"], "use either --workers"),
        (["--alert-wait", "-1"], "argument --alert-wait: must be >= 0 and finite, got '-1'"),
        (["--pager", "ftp://127.0.0.1:9095"], "argument --pager: must be an http(s) URL"),
        (["--pager", "/"], "argument --pager: must be a pager URL or its pages.jsonl file, got '/'"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], needle: str) -> None:
    proc = run_child(loadlens(*argv), timeout=20)
    assert proc.returncode == 2 and needle in proc.stdout


def test_unreachable_target_fails_fast() -> None:
    proc = run_child(loadlens("--host", f"http://127.0.0.1:{free_port()}", "--headless"), timeout=45)
    assert proc.returncode == 1
    # Fast by construction rather than by the clock: the probe was refused at once, it did not wait out its
    # 5 s timeout (that would say "timed out"), and the error line is all it printed (Locust never started).
    assert proc.stdout.startswith("loadlens load: error: cannot reach target http://127.0.0.1:")
    assert proc.stdout.endswith("Connection refused\n") and proc.stdout.count("\n") == 1


def test_dry_run_prints_the_plan() -> None:
    proc = run_child(loadlens("--profile", "seed-stress", "--dry-run", "--time-scale", "0.5"), timeout=20)
    assert proc.returncode == 0
    assert "2. c8: 8 users, 90 s" in proc.stdout
    assert "1. warmup: 4 users, until 100 requests (warmup, excluded)" in proc.stdout
    assert "long-tail 15%" in proc.stdout


def test_plain_locust_rejects_a_bad_profile_with_exit_2(tmp_path: Path) -> None:
    bad = write_profile(tmp_path / "bad.yaml", {"traffic": [], "stages": []})
    proc = run_child(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(ROOT / "loadgen/locustfile.py"),
            "--headless",
            "--load-profile",
            str(bad),
        ],
        timeout=30,
    )
    assert proc.returncode == 2
    line = bad.read_text().splitlines().index("traffic: []") + 1
    assert f"loadlens: error: profile bad.yaml:{line}:1: traffic: must be a non-empty list" in proc.stdout


def test_plain_locust_unreachable_target() -> None:
    proc = run_child(
        [
            sys.executable, "-m", "locust", "-f", str(ROOT / "loadgen/locustfile.py"), "--headless",
            "--host", f"http://127.0.0.1:{free_port()}", "--metrics-port", "0",
        ],
        timeout=30,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "cannot reach target" in proc.stdout
