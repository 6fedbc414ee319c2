"""The base install is the GPU exporter's: built as a wheel and installed alone into a fresh venv, the exporter
runs, nothing of the serving, load or report stacks comes with it, and their subcommands name the missing
extra. The wheel leaves the generators (loadlens/codegen) out."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _run(*argv: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=240, cwd=cwd)


def test_base_install_runs_the_gpu_exporter_only(tmp_path: Path) -> None:
    build = _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", str(ROOT), "-w", tmp_path / "w",
                 cwd=tmp_path)  # fmt: skip
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "w").glob("loadlens-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.startswith("loadlens/codegen")] == []
    assert "loadlens/contracts/slos.yaml" in names
    assert "loadlens/pager/runbooks.md" in names  # docs/runbooks.md, which the pager serves at /runbooks

    venv.create(tmp_path / "v", with_pip=True)
    py = tmp_path / "v" / "bin" / "python"
    install = _run(py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel, cwd=tmp_path)
    assert install.returncode == 0, install.stderr
    listed = _run(py, "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check", cwd=tmp_path).stdout
    installed = {line.split("==")[0].lower() for line in listed.splitlines()}
    assert (
        installed & {"fastapi", "starlette", "uvicorn", "locust", "gevent", "matplotlib", "aiohttp", "httpx"} == set()
    )

    loadlens = tmp_path / "v" / "bin" / "loadlens"
    assert _run(loadlens, "gpu-exporter", "--help", cwd=tmp_path).returncode == 0
    assert _run(py, "-m", "exporters.gpu", "--help", cwd=tmp_path).returncode == 0
    for command, extra in (("serve", "serve"), ("load", "load"), ("report", "report"), ("pager", "serve")):
        proc = _run(loadlens, command, "--help", cwd=tmp_path)
        assert proc.returncode == 2, (command, proc.stderr)
        assert proc.stderr.startswith(f"loadlens {command}: error: needs the '{extra}' extra (")
        assert proc.stderr.endswith(f"not installed): pip install 'loadlens[{extra}]'\n")
    listing = _run(loadlens, "--help", cwd=tmp_path)
    assert listing.returncode == 0 and "needs the 'load' extra" in listing.stdout
