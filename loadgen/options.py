"""The load options shared by ``loadlens load`` and the locustfile, declared once; the default run id.

``loadlens load`` validates each value (``--time-scale 0`` exits 2) and passes it on to Locust as a flag;
plain ``locust -f loadgen/locustfile.py`` reads the same options and the same ``LOADLENS_LOAD_*`` variables.
Where ``loadlens load`` has no default (None: "not given"), Locust reads the option's ``unset`` value, which
the runtime treats as "not given" (``--seed -1``, ``--model ''``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from loadlens.contracts.ports import PORT
from loadlens.util.cliutil import env_name, non_negative_int, port_number, positive_float

ENV_PREFIX = "LOADLENS_LOAD_"


def http_url(text: str) -> str:
    """An http(s) URL with a host; a trailing slash is dropped."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"must be an http(s) URL like http://127.0.0.1:8000, got {text!r}")
    return text.rstrip("/")


@dataclass(frozen=True)
class LoadOption:
    """One option. ``check`` validates for ``loadlens load``; ``kind`` is Locust's plain conversion."""

    flag: str
    help: str
    default: Any = None
    check: Callable[[str], Any] | None = None
    kind: type = str
    unset: Any = None
    """Locust's default where ``default`` is None."""
    locust_flag: str = ""
    """Locust's spelling where it differs (Locust has its own ``--profile``)."""
    switch: bool = False
    """A flag without a value (``store_true``); its variable is on for 1, true, yes or on."""

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env_var(self) -> str:
        return env_name(self.flag, ENV_PREFIX)

    @property
    def locust_default(self) -> Any:
        return self.unset if self.default is None else self.default


LOAD_OPTIONS: tuple[LoadOption, ...] = (
    LoadOption(
        "--profile",
        "packaged profile name (see --list-profiles) or a YAML path",
        "quick",
        locust_flag="--load-profile",
    ),
    LoadOption("--model", "model to request (default: the first model the target lists)", unset=""),
    LoadOption("--users-scale", "multiply users, rates and pools by F", 1.0, positive_float, float),
    LoadOption("--time-scale", "multiply every stage duration by F", 1.0, positive_float, float),
    LoadOption("--results", "directory for run directories", "results"),
    LoadOption("--run-id", "run directory name (default: PROFILE-UTCTIMESTAMP)", unset=""),
    LoadOption("--prometheus", "Prometheus URL: add server-side figures per stage", check=http_url, unset=""),
    LoadOption("--seed", "prompt seed (default: the profile's)", check=non_negative_int, kind=int, unset=-1),
    LoadOption("--slo-file", "SLO file for goodput and breaches (default: packaged slos.yaml)", unset=""),
    LoadOption("--api-key", "bearer token for the target; prefer the variable (flags show in ps)", unset=""),
    LoadOption("--metrics-port", "/metrics port, 0 = off", PORT["loadgen"], port_number, int),
    LoadOption("--metrics-host", "/metrics bind address (0.0.0.0 in containers)", "127.0.0.1"),
    LoadOption(
        "--cpu-threshold",
        "load-generator CPU (1 = a core) above which results are invalid (default: SLO file, else 0.9)",
        check=positive_float,
        kind=float,
        unset=0.0,
    ),
    LoadOption("--progress-interval", "seconds between progress lines, 0 = off", 5.0, float, float),
    LoadOption(
        "--stop-on-oversaturation",
        "end the run when a stage is over-saturated (its queue and TTFT grow; docs/loadgen.md)",
        False,
        kind=bool,
        switch=True,
    ),
)
OPTIONS: dict[str, LoadOption] = {o.dest: o for o in LOAD_OPTIONS}


def add_cli_option(parser: argparse.ArgumentParser, dest: str, arg: Callable[..., argparse.Action]) -> argparse.Action:
    """Add a shared option to ``loadlens load`` through its ``env_arg`` (``arg(parser, flag, help=..., ...)``)."""
    option = OPTIONS[dest]
    kwargs: dict[str, Any] = {"default": option.default}
    if option.switch:
        kwargs["action"] = "store_true"
    elif option.check is not None:
        kwargs["type"] = option.check
    return arg(parser, option.flag, help=option.help, **kwargs)


def add_locust_arguments(parser: Any) -> None:
    """The same options for Locust's (configargparse) parser, each with its ``LOADLENS_LOAD_*`` variable.

    Their destinations follow Locust's spelling (``options.load_profile``).
    """
    group = parser.add_argument_group("loadlens", "LLM load profile (docs/loadgen.md)")
    for option in LOAD_OPTIONS:
        if option.switch:
            flag = option.locust_flag or option.flag
            group.add_argument(flag, action="store_true", env_var=option.env_var, help=option.help)
            continue
        group.add_argument(
            option.locust_flag or option.flag,
            type=option.kind,
            default=option.locust_default,
            env_var=option.env_var,
            help=option.help,
        )


def locust_flag(dest: str) -> str:
    option = OPTIONS[dest]
    return option.locust_flag or option.flag


def default_run_id(profile_name: str, now: datetime | None = None) -> str:
    """``PROFILE-UTCTIMESTAMP``, the run directory's name when ``--run-id`` is not given."""
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{profile_name}-{stamp}"
