"""No import circles among the first-party modules: the import graph, read from the source, has no cycle.

A circle is two modules that each need the other (directly or through others): neither can be understood,
tested or moved alone, and at run time one of them sees the other half-initialised, which is why such code
grows lazy imports "to avoid a cycle". Those count here like any other: the graph has an edge for **every
import statement** of a module, at its top, inside a function, or under ``if TYPE_CHECKING:`` (a type-only
import is still a dependency of the design: a module that needs another's types to describe itself depends
on it, and the day someone needs the value at run time the circle is real).

How statements become edges (``a.b`` is a first-party module when ``a/b.py`` or ``a/b/__init__.py`` exists):

- ``import a.b.c`` is an edge to ``a.b.c``; ``from a.b import name`` is an edge to ``a.b.name`` when that is a
  module (a submodule imported by name), else to ``a.b`` (a name defined there). A name that is no module of
  the tree resolves to the longest prefix that is one; third-party and standard-library modules are no nodes.
- The packages above the named module (``a``, ``a.b``) get **no** edge, although Python runs their
  ``__init__`` first: nothing of theirs is used, and counting them would make every package whose
  ``__init__`` re-exports its submodules a false circle (``a/__init__`` imports ``a.b.c``, which "imports"
  ``a``). A package's ``__init__`` is a module like the others: its own imports are edges, and a module that
  imports a name from it (``from a import name``) has an edge to it, so a real circle through an ``__init__``
  is still seen.
- Relative imports (refused by tests/test_architecture.py anyway) resolve against the importing package.

The strongly connected components of the graph (Tarjan) must all be single modules; for each larger one the
failure names one circle through it, each step with the file and line of its import statement.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

from tests.support.paths import ROOT

PACKAGES = ("loadlens", "exporters", "loadgen", "benchmarks")

Edges = dict[str, dict[str, str]]
"""module -> {imported module -> 'file:line' of the first statement importing it}"""


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Every first-party module under ``root``, by dotted name."""
    out: dict[str, Path] = {}
    for top in packages:
        for path in sorted((root / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                out[_module_name(path, root)] = path
    return out


def _known(name: str, known: dict[str, Path]) -> str | None:
    """``name`` or its longest prefix that is a module of the tree; None for other packages' modules."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: dict[str, Path]) -> list[str]:
    """The first-party modules one import statement imports (see the module docstring)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, *([base] if base else [])])
        # each name is a submodule (base.name) or a name defined in base
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    return [m for m in (_known(n, known) for n in names) if m is not None and m != module]


def import_graph(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> Edges:
    known = modules(root, packages)
    graph: Edges = {name: {} for name in known}
    for name, path in known.items():
        rel = path.relative_to(root)
        statements = [
            n for n in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(n, ast.Import | ast.ImportFrom)
        ]
        for node in sorted(statements, key=lambda n: n.lineno):
            for target in _targets(node, name, path.name == "__init__.py", known):
                graph[name].setdefault(target, f"{rel}:{node.lineno}")
    return graph


def components(graph: Edges) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative: no recursion limit), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = []
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, iter(sorted(graph[start]))))
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(sorted(component))
    return sorted(out)


def _circle(graph: Edges, component: list[str]) -> list[str]:
    """A shortest circle from the component's first module back to it, inside the component (breadth first)."""
    members = set(component)
    first = component[0]
    came_from: dict[str, str] = {}
    queue = deque([first])
    while queue:
        node = queue.popleft()
        for succ in sorted(graph[node]):
            if succ == first:
                path = [node]
                while path[-1] != first:
                    path.append(came_from[path[-1]])
                return [*reversed(path), first]
            if succ in members and succ not in came_from:
                came_from[succ] = node
                queue.append(succ)
    raise AssertionError(f"{component} is no circle")  # a component of several modules always has one


def circles(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> list[str]:
    """One line per import circle: 'a -> b (file:line) -> a (file:line)', plus how many modules it spans."""
    graph = import_graph(root, packages)
    found = []
    for component in components(graph):
        if len(component) < 2:
            continue
        path = _circle(graph, component)
        steps = " -> ".join(f"{b} ({graph[a][b]})" for a, b in zip(path, path[1:], strict=False))
        found.append(f"{path[0]} -> {steps} [{len(component)} modules in the circle: {', '.join(component)}]")
    return found


def test_no_import_circles() -> None:
    assert circles() == []


def test_the_checker_sees_a_circle(tmp_path: Path) -> None:
    """Circles through a lazy import, through ``from pkg import submodule`` and a relative import, and through a
    type-only import into a package ``__init__`` are each reported with their files and lines; a package
    ``__init__`` re-exporting its submodule, and standard-library and third-party imports, make no circle."""
    type_only = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from exporters.gpu.x import X\n"
    files = {
        "loadgen/__init__.py": "from loadgen.store import Store\n",  # re-exports: no circle with loadgen.store
        "loadgen/store.py": "import json\nfrom loadgen.workload import Stats\n",
        "loadgen/workload.py": "def f() -> None:\n    from loadgen.store import Dist\n",  # lazy: counts
        "loadlens/__init__.py": "",
        "loadlens/util/__init__.py": "",
        "loadlens/util/a.py": "from loadlens.util import b\n",  # b is a submodule: the edge is loadlens.util.b
        "loadlens/util/b.py": "import yaml\nimport loadlens.util.c\n",
        "loadlens/util/c.py": "from . import a\n",
        "exporters/__init__.py": "",
        "exporters/gpu/__init__.py": type_only,
        "exporters/gpu/x.py": "from exporters.gpu import something_in_init\n",  # a name of the __init__
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert circles(tmp_path) == [
        "exporters.gpu -> exporters.gpu.x (exporters/gpu/__init__.py:4) -> exporters.gpu (exporters/gpu/x.py:1)"
        " [2 modules in the circle: exporters.gpu, exporters.gpu.x]",
        "loadgen.store -> loadgen.workload (loadgen/store.py:2) -> loadgen.store (loadgen/workload.py:2)"
        " [2 modules in the circle: loadgen.store, loadgen.workload]",
        "loadlens.util.a -> loadlens.util.b (loadlens/util/a.py:1) -> loadlens.util.c (loadlens/util/b.py:2)"
        " -> loadlens.util.a (loadlens/util/c.py:1) [3 modules in the circle: loadlens.util.a, loadlens.util.b,"
        " loadlens.util.c]",
    ]
