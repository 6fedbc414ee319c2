"""YAML documents validated by pydantic models, with errors that name the file, line, column and field.

Every YAML file loadlens validates (the SLO file, sim profiles, load profiles) is read here, so a mistake is
found the same way: a :class:`Problem`, printed ``FILE:LINE:COL: field.path: reason`` (the SLO file's message;
the profiles keep the wording their tests pin: a sim profile's adds the line and column, a load profile's error
carries the problem)::

    doc = parse_yaml(path.read_text(), str(path))    # yaml.YAMLError if it is not YAML
    try:
        slo_doc = doc.validate(SloDocument)
    except DocumentInvalid as err:
        print(err.problem)   # slos.yaml:17:5: classes[0].ttft_seconds: must be in (0.0, inf], got -1

The document keeps PyYAML's node tree beside the data, so a pydantic error's ``loc`` (``("classes", 0,
"ttft_seconds")``) finds its line: the key's mark for a mapping entry, the item's for a list item, and for a
field that is absent the mapping that lacks it. A document built from data in memory (``Document(data)``) has
no marks; its problems name only the field.

Validators state their reason in the project's words with :func:`fail`: the reason is the message exactly
(pydantic adds nothing), and ``at`` extends the path, so a check on a whole mapping can name one of its fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

Loc = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)

ERROR_TYPE = "loadlens"
"""The pydantic error type :func:`fail` raises; other types are pydantic's own (``missing``, ``model_type``)."""


def fail(reason: str, *at: str | int, bare: bool = False, refer: Loc | None = None) -> PydanticCustomError:
    """An error for a validator to raise: ``reason`` is the message as is; ``at`` is appended to the path of
    the value being validated. ``bare``: the reason names the field itself, so the field is not printed.
    ``refer``: another field, relative to the value being validated, whose printed path replaces ``{refer}``
    in the reason ("set it here or in {refer}")."""
    # pydantic fills every ``{key}`` of ctx into the message, so only "reason" may appear in one.
    return PydanticCustomError(ERROR_TYPE, "{reason}", {"reason": reason, "_at": at, "_bare": bare, "_refer": refer})


def dotted(loc: Loc) -> str:
    """``("stages", 0, "users")`` -> ``stages[0].users``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass(frozen=True)
class Problem:
    """One mistake in a document: where it is and why. ``str()`` is ``FILE:LINE:COL: field: reason``; parts
    that are unknown (a document from memory has no file or marks) are left out."""

    file: str | None
    line: int | None
    column: int | None
    loc: Loc
    field: str
    """The path as printed (a loader may label it differently from :func:`dotted`); empty for the document."""
    reason: str

    @property
    def where(self) -> str:
        """``FILE:LINE:COL``, ``FILE`` without marks, or empty without a file."""
        if self.file is None:
            return ""
        return self.file if self.line is None else f"{self.file}:{self.line}:{self.column}"

    def __str__(self) -> str:
        return ": ".join(part for part in (self.where, self.field, self.reason) if part)


class DocumentInvalid(ValueError):
    """A document failed its model; ``problem`` is the first mistake (in the model's field order)."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


class Document:
    """Parsed YAML data with the node tree it came from (None for data built in memory)."""

    def __init__(self, data: Any, file: str | None = None, root: yaml.Node | None = None) -> None:
        self.data = data
        self.file = file
        self.root = root

    def mark(self, loc: Loc) -> tuple[int, int] | None:
        """1-based (line, column) of the deepest node on ``loc``'s path; None without marks."""
        if self.root is None:
            return None
        node, mark = self.root, self.root.start_mark
        for part in loc:
            found = _child(node, part)
            if found is None:
                break
            node, mark = found
        return mark.line + 1, mark.column + 1

    def problem(self, loc: Loc, reason: str, *, label: Callable[[Loc], str] = dotted, bare: bool = False) -> Problem:
        """A mistake at ``loc`` found outside the model (a file the field names that does not exist)."""
        mark = self.mark(loc)
        return Problem(
            self.file,
            None if mark is None else mark[0],
            None if mark is None else mark[1],
            loc,
            "" if bare else label(loc),
            reason,
        )

    def validate(self, model: type[M], *, context: Any = None, label: Callable[[Loc], str] = dotted) -> M:
        """``model`` validated from the data. Raises :class:`DocumentInvalid` naming the first mistake."""
        try:
            return model.model_validate(self.data, context=context)
        except ValidationError as err:
            raise DocumentInvalid(self.first_problem(err, label=label)) from None

    def first_problem(self, err: ValidationError, *, label: Callable[[Loc], str] = dotted) -> Problem:
        first = err.errors(include_url=False)[0]
        loc: Loc = tuple(first["loc"])
        ctx = first.get("ctx") or {}
        if first["type"] == ERROR_TYPE:
            reason = first["msg"]
            if ctx.get("_refer") is not None:
                reason = reason.replace("{refer}", label((*loc, *ctx["_refer"])))
            return self.problem((*loc, *ctx.get("_at", ())), reason, label=label, bare=bool(ctx.get("_bare")))
        return self.problem(loc, _reason(first["type"], first["msg"], first.get("input")), label=label)


def parse_yaml(text: str | bytes, file: str | None = None) -> Document:
    """One YAML document (safe tags only) with its marks. Raises ``yaml.YAMLError``."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        data = None if root is None else loader.construct_document(root)
    finally:
        loader.dispose()
    return Document(data, file, root)


def yaml_error_line(err: yaml.YAMLError) -> int | None:
    """The 1-based line a YAML syntax error points at, when it has one."""
    mark = getattr(err, "problem_mark", None)
    return None if mark is None else int(mark.line) + 1


def _child(node: yaml.Node, part: str | int) -> tuple[yaml.Node, yaml.Mark] | None:
    """The node under ``node`` at ``part`` and where to point: a mapping entry at its key (where the eye looks
    for a field), a list item at the item."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return value, key.start_mark
        return None
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        item: yaml.Node = node.value[part]
        return item, item.start_mark
    return None


_MAPPING_TYPES = ("model_type", "dict_type", "model_attributes_type")


def _reason(kind: str, msg: str, value: Any) -> str:
    """pydantic's own error types in the project's words (the models' validators use :func:`fail`)."""
    if kind == "missing":
        return "missing"
    if kind in _MAPPING_TYPES:
        return f"must be a mapping, got {type(value).__name__}"
    if kind == "list_type":
        return f"must be a list, got {type(value).__name__}"
    return msg.removeprefix("Value error, ")
