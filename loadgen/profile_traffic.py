"""A profile's traffic mix: each entry is one kind of request, picked in proportion to its ``weight``
(docs/loadgen.md, *Traffic*). The runtime types (``Traffic`` and its parts) and the entry's schema
(:class:`TrafficEntry`, a pydantic model whose ``traffic()`` builds the runtime type).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from loadgen.profile_fields import (
    NAME,
    Count,
    Duration,
    Flag,
    Length,
    LengthDist,
    Name,
    OptCount,
    Positive,
    ProfileError,
    SecondsDist,
    Section,
    integer,
    optional,
)
from loadgen.profile_sources import Prompt, PromptSpec
from loadlens.contracts.slo import PriorityClass, SLOConfig
from loadlens.contracts.yaml_document import fail

Endpoint = Literal["chat", "completions"]

BASE_MODEL = "base"
"""In ``adapters``, the key that stands for the entry's ``model`` (else the run's model): the base model."""


@dataclass(frozen=True)
class Images:
    count: int = 0
    width: int = 512
    height: int = 512


@dataclass(frozen=True)
class Prefix:
    """``count`` distinct shared prefixes of ``tokens`` tokens; each request starts with one of them.

    With ``shares`` (the ``groups`` form) group i is sent with exactly that fraction of the entry's requests
    (smooth weighted round robin) and is ``lengths[i]`` tokens long; the rest of the requests (1 − Σ shares)
    get no prefix. Without, each request picks one of the ``count`` prefixes at random.
    """

    count: int
    tokens: int
    shares: tuple[float, ...] = ()
    lengths: tuple[int, ...] = ()

    def group_tokens(self, group: int) -> int:
        return self.lengths[group] if self.lengths else self.tokens


@dataclass(frozen=True)
class ConversationSpec:
    """Multi-turn conversations (docs/loadgen.md, *Conversations*): ``turns`` requests per conversation, each
    carrying the conversation so far, with ``think_time_s`` between a reply and the next turn."""

    turns: LengthDist
    think_time_s: SecondsDist = field(default_factory=lambda: SecondsDist(0.0))


@dataclass(frozen=True)
class Traffic:
    """One kind of request in the mix, chosen in proportion to ``weight``."""

    name: str
    weight: float
    endpoint: Endpoint
    model: str | None
    priority: int | None
    prompt: PromptSpec
    output_tokens: LengthDist | None
    output_from_dataset: bool
    ignore_eos: bool
    temperature: float
    images: Images
    prefix: Prefix | None
    priority_class: str | None = None
    """The SLO class named in the entry (``class``); None: the class of ``effective_priority``."""
    conversation: ConversationSpec | None = None
    think_time_s: SecondsDist | None = None
    """A closed-loop user's wait after this entry's answer before its next request (not with a conversation,
    which has its own between turns); None: the next request at once."""
    adapters: tuple[tuple[str | None, float], ...] = ()
    """(model, weight) pairs the entry's requests are spread over (exact shares); None is the base model."""

    def models_for(self, default: str) -> tuple[str, ...]:
        """Every model name this entry sends to, with ``default`` for the run's model."""
        base = self.model or default
        if not self.adapters:
            return (base,)
        return tuple(dict.fromkeys(base if m is None else m for m, _ in self.adapters))

    @property
    def effective_priority(self) -> int:
        """The priority the server applies (vLLM's default is 0 when the field is absent)."""
        return 0 if self.priority is None else self.priority

    def slo_class(self, slos: SLOConfig) -> PriorityClass:
        """The entry's SLO class: the one its ``class`` names, else the one its priority falls in. A class
        given by name does not depend on what the server does with priorities (an FCFS server refuses
        non-zero ones), so one mix can be judged under both policies."""
        if self.priority_class is None:
            return slos.class_for_priority(self.effective_priority)
        for cls in slos.classes:
            if cls.name == self.priority_class:
                return cls
        raise ProfileError(
            f"traffic {self.name}.class: no SLO class {self.priority_class!r} in {slos.source}"
            f" (classes: {', '.join(slos.class_names)})"
        )


# --- the schema --------------------------------------------------------------------------------------------------


class ImagesEntry(Section):
    count: Annotated[int, BeforeValidator(lambda v: integer(v, 0))] = 1
    width: Count = 512
    height: Count = 512

    @model_validator(mode="after")
    def _size(self) -> ImagesEntry:
        if self.width > 8192 or self.height > 8192:
            raise fail("width and height must be <= 8192")
        return self


class PrefixGroup(Section):
    share: Positive
    tokens: OptCount = None

    @model_validator(mode="after")
    def _share(self) -> PrefixGroup:
        if self.share > 1:
            raise fail(f"must be in (0, 1], got {self.share:g}", "share")
        return self


def _groups(value: Any) -> Any:
    if value is not None and (not isinstance(value, list) or not value):
        raise fail("must be a non-empty list of {share, tokens}")
    return value


class PrefixEntry(Section):
    """``count`` prefixes picked at random, or ``groups`` with stated shares; ``tokens`` long (a group may say
    its own)."""

    count: Count = 1
    tokens: OptCount = None
    groups: Annotated[list[PrefixGroup] | None, BeforeValidator(_groups)] = None

    @classmethod
    def prepare(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("groups") is not None and "count" in value:
            raise fail("set count (prefixes picked at random) or groups (stated shares), not both")
        return value

    @model_validator(mode="after")
    def _lengths(self) -> PrefixEntry:
        if self.groups is None:
            if self.tokens is None:
                raise fail("missing", "tokens")
            return self
        for i, group in enumerate(self.groups):
            if group.tokens is None and self.tokens is None:
                raise fail("missing (set it here or in {refer})", "groups", i, "tokens", refer=("tokens",))
        total = sum(g.share for g in self.groups)
        if total > 1 + 1e-9:
            raise fail(f"shares sum to {total:g}, more than 1", "groups")
        return self

    def prefix(self) -> Prefix:
        if self.groups is None:
            assert self.tokens is not None  # checked above
            return Prefix(self.count, self.tokens)
        lengths = [g.tokens if g.tokens is not None else self.tokens for g in self.groups]
        shares = tuple(g.share for g in self.groups)
        return Prefix(len(shares), self.tokens or lengths[0], shares, tuple(lengths))  # type: ignore[arg-type]


class ConversationEntry(Section):
    turns: Length
    think_time_s: Duration = Field(default_factory=lambda: Duration(mean=0.0))

    @classmethod
    def prepare(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "turns" not in value:
            raise fail("missing (a number of turns or a {mean, stdev, min, max} distribution)", "turns")
        return value

    def spec(self) -> ConversationSpec:
        return ConversationSpec(self.turns.dist(), self.think_time_s.dist())


def _adapters(value: Any) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise fail(f"must be a mapping, got {type(value).__name__}")
    if not value:
        raise fail("must name at least one model (adapter name: weight)")
    for name in value:
        if not isinstance(name, str) or not name:
            raise fail(f"model names must be non-empty strings, got {name!r}")
    return value


def _temperature(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 2:
        raise fail(f"must be a number in [0, 2], got {value!r}")
    return float(value)


class TrafficEntry(Section):
    """One entry of ``traffic`` (with ``defaults`` merged in). Fields are checked in this order."""

    INTERNAL = frozenset({"output_from_dataset"})

    endpoint: Endpoint = "chat"
    model: str | None = None
    priority: int | None = None
    priority_class: str | None = Field(None, alias="class")
    prompt: Prompt = Field(default_factory=lambda: Prompt.model_validate({}))
    output_from_dataset: bool = False
    """``output_tokens: dataset``: each ShareGPT conversation's own reply length."""
    temperature: Annotated[float, BeforeValidator(_temperature)] = 0.0
    images: ImagesEntry | None = None
    prefix: PrefixEntry | None = None
    conversation: ConversationEntry | None = None
    think_time_s: Duration | None = None
    adapters: Annotated[dict[str, Positive] | None, BeforeValidator(optional(_adapters))] = None
    name: Name = Field(None, validate_default=True)
    weight: Positive = 1.0
    output_tokens: Length = Field(default_factory=lambda: Length(mean=128))
    ignore_eos: Flag = True

    @classmethod
    def prepare(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("output_tokens") == "dataset":
            del value["output_tokens"]
            value["output_from_dataset"] = True
        return value

    @field_validator("endpoint", mode="before")
    @classmethod
    def _endpoint(cls, value: Any) -> Any:
        if value not in ("chat", "completions"):
            raise fail(f"must be chat or completions, got {value!r}")
        return value

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, value: Any) -> Any:
        if value is not None and (not isinstance(value, str) or not value):
            raise fail(f"must be a non-empty string, got {value!r}")
        return value

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise fail(f"must be an integer, got {value!r}")
        return value

    @field_validator("priority_class", mode="before")
    @classmethod
    def _class(cls, value: Any) -> Any:
        if value is not None and (not isinstance(value, str) or not NAME.match(value)):
            raise fail(f"must be an SLO class name, got {value!r}")
        return value

    @model_validator(mode="after")
    def _combinations(self) -> TrafficEntry:
        if self.output_from_dataset and self.prompt.source != "sharegpt":
            raise fail("'dataset' needs prompt.source sharegpt", "output_tokens")
        if self.images is not None and self.images.count and self.endpoint != "chat":
            raise fail("image parts need endpoint chat", "images")
        if self.conversation is not None:
            if self.prompt.source != "synthetic":
                raise fail("needs prompt.source synthetic (later turns are synthetic text)", "conversation")
            if self.images is not None and self.images.count:
                raise fail("images are not supported in conversations", "conversation")
            if self.think_time_s is not None:
                raise fail("a conversation has its own (conversation.think_time_s, between its turns)", "think_time_s")
        return self

    def traffic(self) -> Traffic:
        images = self.images
        return Traffic(
            name=self.name,
            weight=self.weight,
            endpoint=self.endpoint,
            model=self.model,
            priority=self.priority,
            prompt=self.prompt.spec(),
            output_tokens=None if self.output_from_dataset else self.output_tokens.dist(),
            output_from_dataset=self.output_from_dataset,
            ignore_eos=self.ignore_eos,
            temperature=self.temperature,
            images=Images() if images is None else Images(images.count, images.width, images.height),
            prefix=None if self.prefix is None else self.prefix.prefix(),
            priority_class=self.priority_class,
            conversation=None if self.conversation is None else self.conversation.spec(),
            think_time_s=None if self.think_time_s is None else self.think_time_s.dist(),
            adapters=tuple((None if m == BASE_MODEL else m, w) for m, w in (self.adapters or {}).items()),
        )
