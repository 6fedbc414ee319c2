"""`loadlens serve` argument handling: env variables, and exit 2 with one line for every user mistake."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadlens.cli import build_parser, main


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "loadlens.cli", *args], capture_output=True, text=True, env=full_env, timeout=30
    )


def test_help_documents_every_flag_with_its_env_variable() -> None:
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr,index]
    one_shot = ("help", "list_profiles", "write_tokenizer")  # act and exit: no environment variable
    flags = [a for a in serve._actions if a.option_strings and a.dest not in one_shot]
    assert {a.dest for a in flags} >= {
        "engine",
        "upstream",
        "model_profile",
        "gpu_profile",
        "speed",
        "seed",
        "host",
        "port",
    }
    for action in flags:
        assert action.help and f"[env: LOADLENS_{action.dest.upper()}]" in action.help, action.dest


def test_env_variable_sets_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADLENS_PORT", "8123")
    monkeypatch.setenv("LOADLENS_ENGINE", "openai")
    args = build_parser().parse_args(["serve"])
    assert args.port == 8123
    assert args.engine == "openai"
    assert build_parser().parse_args(["serve", "--port", "9000"]).port == 9000


@pytest.mark.parametrize(
    ("env", "argv", "knobs"),
    [
        # One knob in the variable: the form docker-compose.yml and k8s/overlays/sim set.
        ("scheduling_policy=priority", [], {"scheduling_policy": "priority"}),
        ("scheduling_policy=priority, max_num_seqs=64", [], {"scheduling_policy": "priority", "max_num_seqs": 64}),
        # A flag overrides the same knob from the environment and adds to the others.
        (
            "scheduling_policy=priority,max_num_seqs=64",
            ["--knob", "max_num_seqs=8"],
            {"scheduling_policy": "priority", "max_num_seqs": 8},
        ),
        ("", ["--knob", "max_num_seqs=8"], {"max_num_seqs": 8}),
    ],
)
def test_knobs_from_the_environment_and_flags(
    monkeypatch: pytest.MonkeyPatch, env: str, argv: list[str], knobs: dict[str, object]
) -> None:
    from exporters.serving.cli import _knob_overrides

    monkeypatch.setenv("LOADLENS_KNOB", env)
    assert _knob_overrides(build_parser().parse_args(["serve", *argv])) == knobs


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["serve", "--engine", "openai"], {}, "--engine openai needs --upstream URL"),
        (["serve", "--engine", "openai", "--upstream", "ftp://x"], {}, "upstream must be an http(s) URL"),
        (["serve", "--port", "99999"], {}, "port out of range"),
        (["serve", "--speed", "0"], {}, "must be a positive finite number"),
        (
            ["serve", "--engine", "openai", "--upstream", "http://x:1", "--enable-mfu-metrics"],
            {},
            "--enable-mfu-metrics with --engine openai needs --model-config",
        ),
        (
            ["serve", "--engine", "openai", "--upstream", "http://x:1", "--model-config", "tiny"],
            {},
            "--model-config is read only with --enable-mfu-metrics",
        ),
        (["serve", "--model-config", "tiny"], {}, "--model-config applies to --engine openai only"),
        (
            ["serve", "--engine", "openai", "--upstream", "http://x:1", "--enable-mfu-metrics", "--model-config", "x"],
            {},
            "--model-config unknown model profile 'x'",
        ),
        (["serve"], {"LOADLENS_PORT": "http"}, "LOADLENS_PORT='http'"),
        (["serve"], {"LOADLENS_ENGINE": "magic"}, "LOADLENS_ENGINE='magic'"),
        (["serve", "--lora-root", "/nonexistent/dir"], {}, "is not a directory"),
        (["serve", "--knob", "oops"], {}, "expected NAME=VALUE"),
        (["serve", "--upstream-probe-dir", "/tmp"], {}, "--upstream-probe-dir applies to --engine openai only"),
        (
            ["serve", "--engine", "openai", "--upstream", "http://x:1", "--upstream-probe-dir", "/etc/hostname"],
            {},
            "--upstream-probe-dir /etc/hostname is not a directory",
        ),
        (
            ["serve"],
            {"LOADLENS_KNOB": "scheduling_policy=priority,oops"},
            "LOADLENS_KNOB='scheduling_policy=priority,oops'",
        ),
    ],
)
def test_user_mistakes_exit_2_with_one_line(argv: list[str], env: dict[str, str], needle: str) -> None:
    proc = _run(*argv, env=env)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert needle in last


def test_broken_slo_file_rejected_before_start(tmp_path: Path) -> None:
    bad = tmp_path / "slos.yaml"
    bad.write_text("version: 1\nclasses: []\n")
    proc = _run("serve", "--engine", "openai", "--upstream", "http://127.0.0.1:1", "--slo-file", str(bad))
    assert proc.returncode == 2
    # The file, then the line and column of the mistake (the empty list sits on line 2).
    assert proc.stderr.strip().splitlines() == [f"loadlens serve: error: {bad}:2:1: classes must be a non-empty list"]


def test_main_returns_2_on_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--engine", "openai"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "loadlens serve: error: --engine openai needs --upstream URL (or LOADLENS_UPSTREAM)"
    )


def test_help_states_each_default_once() -> None:
    proc = _run("serve", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())  # argparse wraps lines
    assert "engine behind the HTTP layer (default: sim) [env: LOADLENS_ENGINE]" in text
    assert text.count("(default: sim)") == 1


def test_version_without_importing_the_subcommands() -> None:
    from loadlens.cli import installed_version

    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from loadlens.cli import main; rc = main(['--version']); "
         "print(sorted(m for m in sys.modules if m.startswith(('exporters', 'loadgen', 'fastapi')))); sys.exit(rc)"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"loadlens {installed_version()}", "[]"]
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert installed_version() == pyproject["project"]["version"]  # the editable install's metadata
