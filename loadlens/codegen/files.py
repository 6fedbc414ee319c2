"""Write the generated files, or check that the committed ones are current.

``--check`` exits 1 naming every stale file, which is what the tests and CI rely on.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path


def stale(files: Mapping[Path, str]) -> list[Path]:
    """The paths whose committed text differs from the generated one (or that are missing)."""
    return [path for path, text in files.items() if not path.exists() or path.read_text() != text]


def write_or_check(files: Mapping[Path, str], root: Path, *, check: bool) -> int:
    outdated = stale(files)
    if check:
        if outdated:
            names = ", ".join(str(p.relative_to(root)) for p in outdated)
            print(f"stale generated files (run `make generate`): {names}", file=sys.stderr)
            return 1
        return 0
    for path in outdated:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path])
        print(f"wrote {path.relative_to(root)}")
    return 0
