"""Run as a script by tests/vllm/test_fake_vllm_shape.py, under either interpreter: the shape of the names a
``vllm`` package defines, as JSON on stdout. Standard library only (it runs in vLLM's environment too).

    python vllm_shape.py inventory <root> <modules JSON>   # the fake at <root>: what each module defines
    python vllm_shape.py lookup <inventory JSON>           # the importable vllm: the same names, looked up

A shape is ``{"kind": "module"|"class"|"function"|"property"|"value"|"missing"|"error", ...}``: a function
(module-level or a class member, inherited or not) has ``params``, its parameter names as ``inspect.signature``
gives them (``*args``, ``**kwargs``, ``name=`` for one with a default, the ``/`` and ``*`` markers); a class has
``fields`` (its annotated attributes: a dataclass's, a msgspec struct's), ``attributes`` (the instance attributes
its methods and its bases' assign, from their source) and ``members``; a value has ``type`` (a string also
``value``)."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import sys
import textwrap
import types
from typing import Any

Shape = dict[str, Any]


def params(func: Any) -> Shape:
    """``{"kind": "function", "params": [...]}``: the names as a signature writes them, without annotations
    or default values (``name=`` where there is one), with its ``/`` and ``*`` markers."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        return {"kind": "function", "params": None, "error": f"no readable signature: {exc}"}
    kinds = inspect.Parameter
    names: list[str] = []
    previous = None
    for p in signature.parameters.values():
        if previous is kinds.POSITIONAL_ONLY and p.kind is not kinds.POSITIONAL_ONLY:
            names.append("/")
        if p.kind is kinds.KEYWORD_ONLY and previous not in (kinds.KEYWORD_ONLY, kinds.VAR_POSITIONAL):
            names.append("*")
        if p.kind is kinds.VAR_POSITIONAL:
            names.append(f"*{p.name}")
        elif p.kind is kinds.VAR_KEYWORD:
            names.append(f"**{p.name}")
        else:
            names.append(p.name + ("=" if p.default is not kinds.empty else ""))
        previous = p.kind
    if previous is kinds.POSITIONAL_ONLY:
        names.append("/")
    return {"kind": "function", "params": names}


def fields(cls: type) -> list[str]:
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        for name in vars(klass).get("__annotations__", {}):
            if name not in names and not name.startswith("_"):
                names.append(name)
    return names


def attributes(cls: type) -> list[str]:
    """The instance attributes the methods of ``cls`` and its bases assign (``self.name = ...``), read from
    their source; a base whose source is not available (``object``, a C extension) adds none."""
    found: set[str] = set()
    for klass in cls.__mro__:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            for target in targets:
                for item in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) and item.value.id == "self":
                        found.add(item.attr)
    return sorted(found)


def member_shape(cls: type, name: str) -> Shape:
    """``cls.name`` as the class resolves it (its own or inherited), without running a descriptor."""
    try:
        raw = inspect.getattr_static(cls, name)
    except AttributeError:
        return {"kind": "missing"}
    if isinstance(raw, property):
        return {"kind": "property"}
    if isinstance(raw, (staticmethod, classmethod)):
        raw = raw.__func__
    if inspect.isfunction(raw) or callable(raw):
        return params(raw)
    return {"kind": "value", "type": type(raw).__name__}


def own_members(cls: type) -> list[str]:
    """The members written in the body of the class or of a base from the same package: their functions (not
    those a decorator such as @dataclass generates), properties and static/class methods."""
    package = cls.__module__.partition(".")[0]
    names: list[str] = []
    for klass in cls.__mro__:
        if klass.__module__.partition(".")[0] != package:
            continue
        filename = getattr(sys.modules[klass.__module__], "__file__", None)
        for name, raw in vars(klass).items():
            func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
            if name in names:
                continue
            if isinstance(func, property) or inspect.isfunction(func) and func.__code__.co_filename == filename:
                names.append(name)
    return names


def shape(value: Any) -> Shape:
    if isinstance(value, types.ModuleType):
        return {"kind": "module"}
    if isinstance(value, type):
        return {"kind": "class", "fields": fields(value), "attributes": attributes(value)}
    if inspect.isfunction(value) or inspect.isbuiltin(value):
        return params(value)
    if isinstance(value, str):
        return {"kind": "value", "type": "str", "value": value}
    return {"kind": "value", "type": type(value).__name__}


def defined_here(module: types.ModuleType, name: str, value: Any) -> bool:
    if name.startswith("__") and name != "__version__" or isinstance(value, types.ModuleType):
        return False
    if isinstance(value, type) or inspect.isfunction(value):
        return value.__module__ == module.__name__
    return not callable(value)


def inventory(root: str, modules: list[str]) -> dict[str, Any]:
    sys.path.insert(0, root)
    result: dict[str, Any] = {}
    for name in modules:
        module = importlib.import_module(name)
        entries: dict[str, Shape] = {}
        for attr, value in vars(module).items():
            if not defined_here(module, attr, value):
                continue
            entry = shape(value)
            if entry["kind"] == "class":
                entry["members"] = {m: member_shape(value, m) for m in own_members(value)}
            entries[attr] = entry
        result[name] = entries
    return result


def lookup(wanted: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, entries in wanted.items():
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            result[name] = {"kind": "error", "error": f"import failed: {type(exc).__name__}: {exc}"}
            continue
        found: dict[str, Shape] = {}
        for attr, fake in entries.items():
            if not hasattr(module, attr):
                found[attr] = {"kind": "missing"}
                continue
            value = getattr(module, attr)
            entry = shape(value)
            if entry["kind"] == "class":
                entry["members"] = {m: member_shape(value, m) for m in fake.get("members", {})}
                # Of the fake's instance attributes, those this class assigns or has as a member (a property).
                assigned = set(entry["attributes"])
                wanted_attributes = fake.get("attributes", [])
                entry["attributes"] = [
                    a for a in wanted_attributes if a in assigned or member_shape(value, a)["kind"] != "missing"
                ]
            found[attr] = entry
        result[name] = found
    return result


def main(argv: list[str]) -> int:
    if argv[:1] == ["inventory"] and len(argv) == 3:
        print(json.dumps(inventory(argv[1], json.loads(argv[2]))))
    elif argv[:1] == ["lookup"] and len(argv) == 2:
        print(json.dumps(lookup(json.loads(argv[1]))))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
