"""``python -m loadlens.codegen [--check] [--root DIR]``: write (or check) every generated file.

alerts/ (rules, Alertmanager config), dashboards/ (Grafana JSON, provisioning), deploy/compose/ (Prometheus,
Alertmanager, Grafana datasources) and k8s/base/generated/ (PrometheusRule, AlertmanagerConfig, ConfigMaps).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from loadlens.codegen import alerts, compose, dashboards, k8s
from loadlens.codegen.files import write_or_check


def _checkout(path: str) -> Path:
    root = Path(path).resolve()
    if not (root / "pyproject.toml").is_file() or not (root / "loadlens" / "codegen").is_dir():
        raise argparse.ArgumentTypeError(f"{root} is not a loadlens checkout (no pyproject.toml and loadlens/codegen/)")
    return root


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadlens.codegen", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file differs from its source")
    parser.add_argument("--root", type=_checkout, default=".", help="the checkout to write into (default: .)")
    args = parser.parse_args(argv)
    root: Path = args.root if isinstance(args.root, Path) else _checkout(args.root)
    code = 0
    # Dashboards before k8s: the dashboard ConfigMaps embed the dashboards' JSON as written.
    for module in (alerts, dashboards, compose, k8s):
        code |= write_or_check(module.outputs(root), root, check=args.check)
    return code


if __name__ == "__main__":
    sys.exit(main())
