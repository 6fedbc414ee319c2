"""Which result document a ``--results`` path names, and writing a report page atomically: one rule for the
experiment, gpu-bench and load results the report reads."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def named_document(path: str | Path, file_name: str, is_document: Callable[[Any], bool]) -> Path | None:
    """The ``file_name`` document ``path`` names: the file itself when it is one (``is_document`` of its JSON),
    or ``path/file_name`` when ``path`` is a directory holding it; None when it names none."""
    given = Path(path)
    if given.is_dir():
        file = given / file_name
        return file if file.is_file() else None
    if given.is_file():
        try:
            doc = json.loads(given.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return given if is_document(doc) else None
    return None


def read_document(file: Path, error: type[Exception]) -> Any:
    """``file``'s JSON; ``error`` (the document's own error class) with a one-line reason when it cannot be
    read or is not valid JSON."""
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise error(f"cannot read {file}: {err.strerror}") from None
    except ValueError as err:
        raise error(f"{file}: not valid JSON: {err}") from None


def write_page(out: Path, file_name: str, page: str) -> Path:
    """``out/file_name`` written whole or not at all (a reader never sees half a page); raises OSError."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / file_name
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return path
