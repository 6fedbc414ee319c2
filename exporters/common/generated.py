"""Files derived from one source of truth (rules, dashboards): write them, or check they are current.

Each generator module builds ``{path: text}`` and calls :func:`run` from its ``main``; ``--check`` exits 1
naming every stale file, which is what the tests and CI rely on.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


def write_or_check(files: Mapping[Path, str], root: Path, *, check: bool) -> int:
    stale = []
    for path, text in files.items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if check:
            stale.append(str(path.relative_to(root)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(root)}")
    if stale:
        print(f"stale generated files (run `make generate`): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


def run(argv: Sequence[str] | None, description: str | None, files: Mapping[Path, str], root: Path) -> int:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if a generated file differs from its source")
    args = parser.parse_args(argv)
    return write_or_check(files, root, check=args.check)
