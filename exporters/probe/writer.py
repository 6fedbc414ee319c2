"""Atomic publication of a probe document: a reader sees the old file or the new one, never a partial one.

The document is written to a hidden temporary file in the same directory (same filesystem, so
``os.replace`` is an atomic rename) and renamed over the target. No fsync: the document is rewritten every
interval and is worthless after a crash, and an fsync could stall the watched process on a busy disk.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

from loadlens.contracts.probe_document import FILE_PREFIX, FILE_SUFFIX

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def document_name(hostname: str, pid: int) -> str:
    """``probe-<host>-<pid>.json``: the hostname keeps pid 1 of two containers apart in one directory."""
    host = _UNSAFE.sub("_", hostname)[:64].lstrip(".") or "host"
    return f"{FILE_PREFIX}{host}-{pid}{FILE_SUFFIX}"


def atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the exporter may run as another user
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
