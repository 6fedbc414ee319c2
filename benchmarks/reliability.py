"""Input hygiene under fuzzing (issue 13): schemathesis against the sim server's own OpenAPI document.

Run: ``python -m benchmarks.reliability [--quick] [--examples N] [--seed S]``

Starts ``loadlens serve --engine sim --model-profile tiny --speed 1000`` on a free port, runs ``schemathesis
run`` on its ``/openapi.json`` (coverage and fuzzing phases, every operation, one worker) with the checks
the document promises (:data:`CHECKS`), and reports the cases generated, the failures by check, and the
server's own count of 500s (``loadlens_requests_total{code="500"}`` and ``http_requests_total{status="5xx"}``
where present). It exits 1 on any failure or server error. ``tests/serving/test_openapi.py`` runs the quick
variant (``--examples 5``, several hundred cases) in CI; the full default (100 examples per operation) generates
more than 1,000.

Not checked, on purpose: ``positive_data_acceptance`` (a schema-valid body can still be refused: context
overflow, unknown knob names, LoRA paths outside the root) and ``negative_data_rejection`` (validation is
pydantic's lax mode, as vLLM's: ``"4"`` is accepted for an integer).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loadlens.util.child import http_child
from loadlens.util.net import free_port

CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance", "response_schema_conformance")


@dataclass
class FuzzResult:
    generated: int
    failures: list[str] = field(default_factory=list)
    """One ``METHOD /path: check title`` per unique failure."""
    errors: list[str] = field(default_factory=list)
    exit_code: int = 0
    seconds: float = 0.0
    output: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.failures and not self.errors


def fuzz(base_url: str, *, examples: int, seed: int, timeout_s: float = 600.0) -> FuzzResult:
    """Run the schemathesis CLI against ``base_url``'s OpenAPI document and read its JSON report."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        argv = [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{base_url}/openapi.json",
            "--checks",
            ",".join(CHECKS),
            "--max-examples",
            str(examples),
            "--seed",
            str(seed),
            "--workers",
            "1",
            "--request-timeout",
            "10",
            "--report",
            "json",
            "--report-json-path",
            str(report),
        ]
        proc = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=timeout_s, check=False)
        if not report.exists():
            return FuzzResult(0, errors=[proc.stderr[-2000:] or proc.stdout[-2000:]], exit_code=proc.returncode)
        doc = json.loads(report.read_text())
    failures = [f"{f.get('operation', '?')}: {f.get('title', f)}" for f in doc.get("failures", [])]
    errors = [str(e)[:500] for e in doc.get("errors", [])]
    return FuzzResult(
        generated=int(doc["test_cases"]["generated"]),
        failures=failures,
        errors=errors,
        exit_code=proc.returncode,
        seconds=float(doc.get("running_time", 0.0)),
        output=proc.stdout[-4000:],
    )


def server_errors(metrics_text: str) -> dict[str, float]:
    """Sums of the server's 5xx counters in a Prometheus text exposition."""
    sums = {'loadlens_requests_total{code="500"}': 0.0, 'http_requests_total{status="5xx"}': 0.0}
    for line in metrics_text.splitlines():
        if line.startswith("loadlens_requests_total{") and 'code="500"' in line:
            sums['loadlens_requests_total{code="500"}'] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("http_requests_total{") and re.search(r'status="5', line):
            sums['http_requests_total{status="5xx"}'] += float(line.rsplit(" ", 1)[1])
    return sums


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 examples per operation (several hundred cases)")
    ap.add_argument("--examples", type=int, default=100, help="max examples per operation and phase")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    examples = 5 if args.quick else args.examples
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "loadlens.cli",
        "serve",
        "--engine",
        "sim",
        "--model-profile",
        "tiny",
        "--speed",
        "1000",
        "--port",
        str(port),
        "--log-level",
        "error",
    ]
    with http_child(cmd, port) as url:
        result = fuzz(url, examples=examples, seed=args.seed)
        errors = server_errors(httpx.get(url + "/metrics").text)
    print(f"schemathesis {', '.join(CHECKS)}; {examples} examples per operation, seed {args.seed}")
    print(f"  cases generated   {result.generated:6d}  ({result.seconds:.1f} s)")
    print(f"  unique failures   {len(result.failures):6d}")
    for failure in result.failures:
        print(f"    {failure}")
    for error in result.errors:
        print(f"  error: {error}")
    for name, value in errors.items():
        print(f"  {name:38s} {value:6.0f}")
    return 0 if result.ok and not any(errors.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
