"""``make bench``: every benchmark module in turn. Each prints its own table; figures are medians."""

from __future__ import annotations

import importlib
import sys

MODULES = (
    "benchmarks.serving",
    "benchmarks.proxy_path",
    "benchmarks.proxy_request",
    "benchmarks.sim_engine",
    "benchmarks.gpu_exporter",
    "benchmarks.gpu_scrape",
    "benchmarks.loadgen",
    "benchmarks.probe",
    "benchmarks.drills",
    "benchmarks.published_vllm",
)


def main() -> int:
    args = sys.argv[1:]
    failed = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name == name:
                print(f"(skipping {name}: not present)")
                continue
            raise
        print(f"\n=== {name} ===", flush=True)
        if module.main(args) != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
