"""The plugin's fake vLLM (tests/vllm_plugin/fake_vllm.py) checked against the real vLLM 0.32 in ``.venv-vllm``.

Every module the fake writes is imported from the real vllm (by vLLM's interpreter, no server), and every name
the fake defines there is looked up: its kind, a function's parameter names, a class's fields, the instance
attributes its methods assign, and its members (tests/support/vllm_shape.py reports both sides). The methods the
plugin hooks (``exporters.vllm_plugin.hooks.HOOKS``) must match exactly; anything else the fake does its own
way, for its own driving, is in ``FAKE_ONLY`` with the reason, and an entry that no longer differs fails too.
The check against vLLM is slow (vLLM's imports: torch); the comparison's own test, fake against reshaped fake,
is not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exporters.vllm_plugin.hooks import HOOKS
from tests.support import vllm_server as rig
from tests.support.paths import ROOT
from tests.vllm.conftest import require_vllm_python
from tests.vllm_plugin import fake_vllm

SCRIPT = ROOT / "tests" / "support" / "vllm_shape.py"

HOOKED = {f"{hook.module}.{patch.qualname}" for hook in HOOKS for patch in hook.patches}
"""The methods the plugin patches: their parameters must be vLLM's, name for name."""

_NO_CONFIG = "the fake is built without a vLLM config: it takes the adapters it can 'read' (path -> rank)"
FAKE_ONLY: dict[str, str] = {
    "vllm.__version__": "write()'s version argument (0.33.0 by default); the hooks' version range has its own tests",
    "vllm.TICK": "the driver's fake clock: simulated work advances it, so the plugin's timings are exact",
    "vllm.tick": "what simulated work calls to advance TICK",
    "vllm.lora.worker_manager.LAST_ERROR": "the fake's last load error: the tests check the plugin lets it pass",
    "vllm.lora.worker_manager.LoRAModel.__init__": "the fake's adapter has a rank and no weights",
    "vllm.lora.worker_manager.LRUCacheLoRAModelManager.__init__": "the fake takes its GPU slot count, no model",
    "vllm.lora.worker_manager.WorkerLoRAManager.__init__": _NO_CONFIG,
    "vllm.lora.worker_manager.WorkerLoRAManager.ranks": _NO_CONFIG,
    "vllm.lora.worker_manager.LRUCacheWorkerLoRAManager.__init__": _NO_CONFIG,
    "vllm.lora.worker_manager.LRUCacheWorkerLoRAManager.ranks": _NO_CONFIG,
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner.__init__": _NO_CONFIG,
    "vllm.v1.worker.gpu.model_runner.GPUModelRunner.__init__": _NO_CONFIG,
    "vllm.v1.worker.gpu_worker.Worker.__init__": _NO_CONFIG,
    "vllm.v1.worker.gpu_worker.Worker.ranks": _NO_CONFIG,
    "vllm.v1.worker.cpu_worker.CPUWorker.__init__": _NO_CONFIG,
    "vllm.v1.worker.cpu_worker.CPUWorker.ranks": _NO_CONFIG,
}
"""What the fake does its own way, by the dotted name of the difference, with why."""


def _modules(root: Path) -> list[str]:
    names = []
    for path in sorted(root.rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        names.append(name.removesuffix(".__init__"))
    return names


def _run(argv: list[str], cwd: Path, path: Path | None = None) -> Any:
    """The script's JSON; ``path``: the directory whose ``vllm`` a lookup finds, instead of the installed one."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | rig.ENV
    if path is not None:
        env["PYTHONPATH"] = str(path)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=cwd, env=env)
    assert proc.returncode == 0, f"{argv[0]} {argv[2]}: rc {proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


def _show(shape: dict[str, Any]) -> str:
    if shape["kind"] == "function":
        return f"({', '.join(shape['params'])})" if shape.get("params") is not None else shape.get("error", "")
    if shape["kind"] == "value":
        return f"{shape['type']} {shape['value']!r}" if "value" in shape else shape["type"]
    return shape["kind"] if "error" not in shape else f"{shape['kind']}: {shape['error']}"


def differences(fake: dict[str, Any], real: dict[str, Any]) -> dict[str, str]:
    """Dotted name -> how the fake differs from the real vLLM there."""
    found: dict[str, str] = {}

    def compare(where: str, mine: dict[str, Any], theirs: dict[str, Any]) -> None:
        if theirs["kind"] == "missing":
            found[where] = "not in vLLM"
        elif mine["kind"] != theirs["kind"] or _show(mine) != _show(theirs) and mine["kind"] != "class":
            found[where] = f"{_show(mine)} in the fake, {_show(theirs)} in vLLM"

    for module, entries in fake.items():
        if real[module].get("kind") == "error":
            found[module] = real[module]["error"]
            continue
        for name, mine in entries.items():
            theirs = real[module][name]
            where = f"{module}.{name}"
            compare(where, mine, theirs)
            if mine["kind"] != "class" or theirs["kind"] != "class":
                continue
            for key, what in (("fields", "a field"), ("attributes", "an instance attribute")):
                for missing in (n for n in mine[key] if n not in theirs[key]):
                    found[f"{where}.{missing}"] = f"{what} in the fake, not in vLLM"
            for member, shape in mine["members"].items():
                compare(f"{where}.{member}", shape, theirs["members"][member])
    return found


def _inventory(root: Path, cwd: Path) -> Any:
    return _run([sys.executable, str(SCRIPT), "inventory", str(root), json.dumps(_modules(root))], cwd)


def test_a_reshaped_vllm_gives_one_line_per_difference(tmp_path: Path) -> None:
    """The comparison itself, without vLLM: the fake against a fake reshaped through write()'s options."""
    fake = _inventory(fake_vllm.write(tmp_path / "fake"), tmp_path)
    other = fake_vllm.write(
        tmp_path / "other", "0.32.0", capture_method="capture_graphs", add_adapter_params="self, *requests",
        active_attr="_slots",
    )  # fmt: skip
    real = _run([sys.executable, str(SCRIPT), "lookup", json.dumps(fake)], tmp_path, path=other)
    manager, runner = "vllm.lora.worker_manager.LRUCache", "GPUModelRunner.capture_model"
    assert differences(fake, real) == {
        "vllm.__version__": "str '0.33.0' in the fake, str '0.32.0' in vLLM",
        f"{manager}LoRAModelManager._active_adapters": "an instance attribute in the fake, not in vLLM",
        f"{manager}WorkerLoRAManager.add_adapter": "(self, lora_request) in the fake, (self, *requests) in vLLM",
        f"vllm.v1.worker.gpu_model_runner.{runner}": "not in vLLM",
        f"vllm.v1.worker.gpu.model_runner.{runner}": "not in vLLM",
    }
    assert differences(fake, fake) == {}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_fake_vllm_has_the_real_shape(tmp_path: Path) -> None:
    interpreter = require_vllm_python()
    root = fake_vllm.write(tmp_path / "fake")
    fake = _inventory(root, tmp_path)
    real = _run([str(interpreter), str(SCRIPT), "lookup", json.dumps(fake)], tmp_path)

    defined = {
        f"{m}.{n}.{member}"
        for m, entries in fake.items()
        for n, e in entries.items()
        for member in e.get("members", {})
    }
    assert defined >= HOOKED, f"hooked methods the fake does not define: {sorted(HOOKED - defined)}"
    assert not HOOKED & FAKE_ONLY.keys(), "a hooked method must have vLLM's shape: it cannot be the fake's own"
    assert real["vllm"]["__version__"]["value"].startswith("0.32."), real["vllm"]["__version__"]

    found = differences(fake, real)
    lines = [f"{where}: {how}" for where, how in sorted(found.items()) if where not in FAKE_ONLY]
    lines += [
        f"{where}: listed in FAKE_ONLY but no longer differs" for where in sorted(FAKE_ONLY.keys() - found.keys())
    ]
    assert not lines, "the fake vLLM differs from vLLM 0.32:\n" + "\n".join(lines)
