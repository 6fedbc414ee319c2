"""The shared load options: one declaration, the same variables and defaults for `loadlens load` and Locust."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import configargparse
import pytest

from loadgen.options import LOAD_OPTIONS, add_locust_arguments, default_run_id, locust_flag
from loadlens.cli import build_parser


def locust_parser() -> configargparse.ArgumentParser:
    parser = configargparse.ArgumentParser()
    add_locust_arguments(parser)
    return parser


def test_locust_defaults_are_the_runtimes_not_given_values() -> None:
    opts = locust_parser().parse_args([])
    assert vars(opts) == {
        "load_profile": "quick",
        "model": "",
        "users_scale": 1.0,
        "time_scale": 1.0,
        "results": "results",
        "run_id": "",
        "prometheus": "",
        "seed": -1,
        "slo_file": "",
        "api_key": "",
        "metrics_port": 9646,
        "metrics_host": "127.0.0.1",
        "cpu_threshold": 0.0,
        "progress_interval": 5.0,
        "stop_on_oversaturation": False,
    }


def test_every_option_reads_the_same_variable_in_both(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "profile": ("burst", "burst"),
        "model": ("m1", "m1"),
        "users_scale": ("0.5", 0.5),
        "time_scale": ("0.25", 0.25),
        "results": ("out", "out"),
        "run_id": ("r7", "r7"),
        "prometheus": ("http://p:9090", "http://p:9090"),
        "seed": ("3", 3),
        "slo_file": ("s.yaml", "s.yaml"),
        "api_key": ("k", "k"),
        "metrics_port": ("9999", 9999),
        "metrics_host": ("0.0.0.0", "0.0.0.0"),
        "cpu_threshold": ("0.75", 0.75),
        "progress_interval": ("0", 0.0),
        "stop_on_oversaturation": ("true", True),
    }
    assert set(values) == {o.dest for o in LOAD_OPTIONS}
    for option in LOAD_OPTIONS:
        monkeypatch.setenv(option.env_var, values[option.dest][0])
    cli = build_parser().parse_args(["load"])
    plain = locust_parser().parse_args([])
    for option in LOAD_OPTIONS:
        expected = values[option.dest][1]
        assert getattr(cli, option.dest) == expected, option.dest
        assert getattr(plain, locust_flag(option.dest).removeprefix("--").replace("-", "_")) == expected


def test_locust_spells_profile_as_load_profile() -> None:
    assert locust_flag("profile") == "--load-profile" and locust_flag("seed") == "--seed"
    assert locust_parser().parse_args(["--load-profile", "burst"]).load_profile == "burst"


def test_cli_defaults_mean_not_given() -> None:
    args = build_parser().parse_args(["load"])
    assert (args.profile, args.model, args.seed, args.run_id, args.cpu_threshold) == ("quick", None, None, None, None)
    assert (args.metrics_port, args.progress_interval, args.users_scale) == (9646, 5.0, 1.0)


def test_default_run_id() -> None:
    assert default_run_id("quick", datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)) == "quick-20260304T050607Z"
    local = datetime(2026, 3, 4, 7, 6, 7, tzinfo=timezone(timedelta(hours=2)))
    assert default_run_id("p", local) == "p-20260304T050607Z"  # always UTC
