"""The import rules of docs/architecture.md, checked on the source (every import statement, lazy ones too).

A part may import only the parts its row allows. ``exporters``, ``loadgen`` and the operator tools share
only the contracts and utilities; generators never import a process. Subcommands are imported by name
(``loadlens.cli.SUBCOMMANDS``), not by an import statement, so the CLI's row stays small.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

BASE = ("loadlens.contracts", "loadlens.util")
# part -> the parts it may import (besides itself, the standard library and third-party packages)
ALLOWED: dict[str, tuple[str, ...]] = {
    "loadlens.contracts": (),
    "loadlens.util": ("loadlens.contracts",),
    "loadlens.alerting": BASE,
    "loadlens.dashboards": BASE,
    "exporters.serving": BASE,
    "exporters.gpu": BASE,
    "exporters.training": (*BASE, "exporters.probe"),
    "exporters.probe": BASE,
    "exporters.vllm_plugin": (*BASE, "exporters.probe"),
    "loadgen": BASE,
    "loadlens.pager": BASE,
    "loadlens.stack": (*BASE, "loadlens.alerting"),
    "loadlens.report": (*BASE, "loadlens.dashboards"),
    # report.html: the report's experiment renderer; adapters: lora make's make_adapter writes an experiment's;
    # training experiments: the training telemetry (hook, maths, series) on every step of their runs
    "loadlens.experiment": (*BASE, "loadlens.report", "loadlens.lora", "exporters.training"),
    "loadlens.demo": (*BASE, "loadlens.stack"),
    "loadlens.train_demo": (*BASE, "loadlens.stack"),
    "loadlens.codegen": (*BASE, "loadlens.alerting", "loadlens.dashboards"),
    "loadlens.lora": BASE,
    # lora.shapes reads a config.json the way `loadlens lora make` does
    "loadlens.gpubench": (*BASE, "loadlens.lora"),
    "loadlens.cli": BASE,
    "loadlens": (),  # loadlens/__init__.py: the version only
    "exporters": (),
}
FIRST_PARTY = ("loadlens", "exporters", "loadgen")


def _module(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _part(module: str) -> str:
    """The longest part name in ALLOWED that ``module`` belongs to."""
    best = ""
    for part in ALLOWED:
        if (module == part or module.startswith(part + ".")) and len(part) > len(best):
            best = part
    return best


def _imports(path: Path) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            out.append((node.lineno, "<relative import>"))
    return out


def _sources(root: Path) -> list[Path]:
    return sorted(p for top in FIRST_PARTY for p in (root / top).rglob("*.py") if "__pycache__" not in p.parts)


def violations(root: Path = ROOT) -> list[str]:
    found: list[str] = []
    for path in _sources(root):
        rel = path.relative_to(root)
        own = _part(_module(path, root))
        assert own, f"{rel} belongs to no part of docs/architecture.md's table"
        for line, name in _imports(path):
            if name == "<relative import>":
                found.append(f"{rel}:{line}: relative import (write the absolute module)")
                continue
            if not name.startswith(FIRST_PARTY):
                continue
            target = _part(name) or name
            if target == own or target in ALLOWED[own] or name == "loadlens.__version__":
                continue
            found.append(f"{rel}:{line}: {own} imports {name}")
    return found


def test_every_import_follows_the_rules() -> None:
    assert violations() == []


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The rule test can fail: each kind of breach is reported with its file and line."""
    files = {
        "loadgen/probe.py": "from exporters.serving.engine import EngineError\nfrom loadlens.contracts import slo\n",
        "exporters/gpu/probe.py": "def f() -> None:\n    import loadgen.sse\n",  # lazy imports count too
        "loadlens/codegen/probe.py": "from loadlens.dashboards.model import Panel\nfrom exporters.gpu import nvml\n",
        "loadlens/util/probe.py": "from . import net\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert violations(tmp_path) == [
        "exporters/gpu/probe.py:2: exporters.gpu imports loadgen.sse",
        "loadgen/probe.py:1: loadgen imports exporters.serving.engine.EngineError",
        "loadlens/codegen/probe.py:2: loadlens.codegen imports exporters.gpu.nvml",
        "loadlens/util/probe.py:1: relative import (write the absolute module)",
    ]


def test_docs_show_every_rule() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    for part, allowed in ALLOWED.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{part}` |")), None)
        assert row is not None, f"docs/architecture.md's import table has no row for {part}"
        cells = row.split("|")[2]
        assert sorted(cells.replace("`", "").replace(",", " ").split()) == sorted(allowed) or (
            not allowed and "nothing" in cells
        ), f"{part}: the docs say {cells.strip()!r}, the rule is {allowed}"


def test_gpu_exporter_command_imports_no_serving_or_load_stack() -> None:
    """`loadlens gpu-exporter` builds only its own parser: FastAPI, Locust and matplotlib stay unimported."""
    code = (
        "import sys\n"
        "from loadlens.cli import main\n"
        "try:\n    main(['gpu-exporter', '--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('fastapi', 'starlette', 'uvicorn', 'locust', 'gevent', 'matplotlib', 'aiohttp',"
        " 'opentelemetry', 'exporters.serving', 'loadgen') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "HEAVY []"


@pytest.mark.parametrize(
    ("blocked", "argv", "extra"),
    [
        ("fastapi", ["serve", "--engine", "sim"], "serve"),
        ("locust", ["load", "--profile", "quick", "--host", "http://127.0.0.1:9"], "load"),
        ("matplotlib", ["report", "--results", "x.json", "--out", "y"], "report"),
        ("matplotlib", ["report", "--help"], "report"),  # its module may not import: even --help says why
        ("numpy", ["lora", "make", "tiny", "--out", "never-written"], "lora"),
        ("fastapi", ["gpu-exporter", "--help"], None),  # the base install's own command
    ],
)
def test_a_missing_extra_is_named_in_one_line(blocked: str, argv: list[str], extra: str | None) -> None:
    """On the base install (the GPU exporter's) a subcommand that needs an extra says which, and exits 2;
    the exporter's own command never needs one."""
    code = (
        "import sys\n"
        f"sys.modules[{blocked!r}] = None  # import of it now fails as if it were not installed\n"
        "from loadlens.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    if extra is None:
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"loadlens {argv[0]}: error: needs the {extra!r} extra ({blocked} not installed): "
        f"pip install 'loadlens[{extra}]'\n"
    )
