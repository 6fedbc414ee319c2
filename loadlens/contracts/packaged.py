"""Packaged name or path: how ``--profile quick``, ``--gpu-profile h100-sxm`` and ``loadlens experiment
fairness`` find their YAML file. One rule for every kind:

1. A value with a ``/`` or ending in ``.yaml``/``.yml`` is a path; a missing file is an error.
2. Anything else is a packaged name: ``DIRECTORY/NAME.yaml``. A packaged name wins over a file of the same name
   in the working directory, so a command means the same wherever it runs.
3. A name with no packaged file that names an existing file (YAML saved without an extension) is that file.
4. Otherwise the error lists the packaged names.

Usage::

    path = resolve_packaged("quick", PROFILE_DIR, "profile")   # PROFILE_DIR/quick.yaml
    packaged_names(PROFILE_DIR)                                 # ["burst", "quick", ...]
"""

from __future__ import annotations

from pathlib import Path

SUFFIXES = (".yaml", ".yml")


class UnknownName(ValueError):
    """Neither a packaged name nor an existing file. ``path_like``: the value was a path (rule 1)."""

    def __init__(self, kind: str, value: str, known: list[str], *, path_like: bool) -> None:
        self.kind, self.value, self.known, self.path_like = kind, value, known, path_like
        if path_like:
            message = f"{kind} file {value}: not found"
        else:
            message = f"unknown {kind} {value!r} (known: {', '.join(known)}; or pass a YAML path)"
        super().__init__(message)


def packaged_names(directory: Path) -> list[str]:
    """The packaged names in ``directory``: its ``*.yaml`` files without the suffix, sorted."""
    return sorted(p.stem for p in directory.glob("*.yaml"))


def looks_like_path(value: str) -> bool:
    return "/" in value or value.endswith(SUFFIXES)


def resolve_packaged(value: str, directory: Path, kind: str) -> Path:
    """The YAML file ``value`` stands for (the rule above). Raises :class:`UnknownName`; ``kind`` ("profile",
    "GPU profile", "experiment") names the kind in its message."""
    if looks_like_path(value):
        path = Path(value)
        if not path.is_file():
            raise UnknownName(kind, value, packaged_names(directory), path_like=True)
        return path
    packaged = directory / f"{value}.yaml"
    if value and packaged.is_file():
        return packaged
    if value and Path(value).is_file():
        return Path(value)
    raise UnknownName(kind, value, packaged_names(directory), path_like=False)
