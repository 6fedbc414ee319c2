"""A pytest plugin that checks each test's pytest-timeout limit against the time the test took, so that a limit
meant to catch a hang never fails a test that was only slow. CI's machine has run a test three times slower
than this one does in `make test`'s parallel phase (calibrate's load-run test: 29 s here, 90 s there), so
a limit is to be at least ``MARGIN`` times what a run here measured.

    make test PYTEST_ARGS='-p tests.support.timeout_margins --timeout-margins=/tmp/margins.jsonl'

Each test (setup, call and teardown together, as pytest-timeout counts them) is written to the file, one JSON
object per line, by whichever process ran it (xdist workers append to the same file); at the end the
controller lists the tests whose limit is under ``MARGIN`` times their time, with the limit that would do.
The file is appended to, never emptied, so that `make test`'s serial phase lists both phases' tests; a test
written twice counts by its last line (remove the file before a fresh run)."""

from __future__ import annotations

import json
import math
from collections.abc import Generator
from pathlib import Path

import pytest

MARGIN = 5.0
"""A limit at least this many times the test's measured time (README, *Development*)."""
ROUND_S = 30
"""Suggested limits are rounded up to this many seconds."""

_KEY = pytest.StashKey[float]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--timeout-margins", metavar="PATH", default=None,
                     help="write each test's time and timeout limit to PATH (JSON lines) and list the limits "
                          f"under {MARGIN:g} times the time")  # fmt: skip


def _path(config: pytest.Config) -> Path | None:
    value = config.getoption("--timeout-margins")
    return Path(value) if value else None


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def limit_of(item: pytest.Item) -> float:
    """The item's pytest-timeout limit: its closest ``timeout`` marker's, else the ini's (0: none)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    if marker is not None and "timeout" in marker.kwargs:
        return float(marker.kwargs["timeout"])
    return float(item.config.getini("timeout") or 0)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    path = _path(item.config)
    if path is None:
        return report
    spent = item.stash.get(_KEY, 0.0) + report.duration
    item.stash[_KEY] = spent
    if call.when == "teardown":
        line = {"id": item.nodeid, "seconds": round(spent, 3), "limit_s": limit_of(item)}
        with path.open("a") as out:
            out.write(json.dumps(line) + "\n")
    return report


def short_limits(lines: list[dict[str, object]]) -> list[tuple[str, float, float, int]]:
    """(test, seconds, limit, suggested limit) for each test whose limit is under ``MARGIN`` times its time,
    slowest first; a test without a limit (0) is never short."""
    last = {str(line["id"]): line for line in lines}
    short = []
    for line in last.values():
        seconds, limit = float(str(line["seconds"])), float(str(line["limit_s"]))
        if limit > 0 and limit < MARGIN * seconds:
            suggested = math.ceil(MARGIN * seconds / ROUND_S) * ROUND_S
            short.append((str(line["id"]), seconds, limit, suggested))
    return sorted(short, key=lambda row: -row[1])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    path = _path(config)
    if path is None or _is_worker(config) or not path.exists():
        return
    lines = [json.loads(text) for text in path.read_text().splitlines() if text.strip()]
    short = short_limits(lines)
    terminalreporter.section(f"timeout margins (limit under {MARGIN:g}x the measured time)")
    for test, seconds, limit, suggested in short:
        terminalreporter.line(f"{seconds:7.1f} s, limit {limit:.0f} s (suggest {suggested} s): {test}")
    tests = len({line["id"] for line in lines})
    terminalreporter.line(f"{len(short)} of {tests} tests short; every time in {path}")
