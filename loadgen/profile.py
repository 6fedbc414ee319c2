"""Load profiles: named stages and a weighted traffic mix, loaded from YAML and validated before anything runs.

Usage::

    profile = load_profile("quick")                      # packaged: loadgen/profiles/quick.yaml
    profile = load_profile("my.yaml").scaled(users=0.5, time=0.1)
    profile.stages[0].name, profile.traffic[0].weight

A name resolves by the one packaged-name-or-path rule (``loadlens/contracts/packaged.py``). The document is
validated by pydantic models, one module per part: the traffic mix (``profile_traffic.py``), the stages
(``profile_stages.py``), prompt files and traces (``profile_sources.py``), field types and distributions
(``profile_fields.py``); this module holds the whole profile. Every problem raises :class:`ProfileError`
whose message starts with the field path (``stages[2].users: must be >= 1, got 0``; loaded from a file,
``profile NAME.yaml:`` in front) and whose ``problem`` holds the file, line and column. The schema is
documented in docs/loadgen.md.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BeforeValidator, Field, field_validator, model_validator

# The runtime types live beside their schema; callers import them from this module.
from loadgen.profile_fields import Count, Name, Positive, Section, number
from loadgen.profile_fields import LengthDist as LengthDist
from loadgen.profile_fields import ProfileError as ProfileError
from loadgen.profile_fields import SecondsDist as SecondsDist
from loadgen.profile_sources import PromptSpec as PromptSpec
from loadgen.profile_sources import TraceReplay as TraceReplay
from loadgen.profile_stages import Arrival as Arrival
from loadgen.profile_stages import Stage as Stage
from loadgen.profile_stages import StageEntry
from loadgen.profile_traffic import BASE_MODEL as BASE_MODEL
from loadgen.profile_traffic import ConversationSpec as ConversationSpec
from loadgen.profile_traffic import Endpoint as Endpoint
from loadgen.profile_traffic import Images as Images
from loadgen.profile_traffic import Prefix as Prefix
from loadgen.profile_traffic import Traffic as Traffic
from loadgen.profile_traffic import TrafficEntry
from loadgen.synthesis import ExactText
from loadgen.tokenizer import Tokenizer, TokenizerError, load_tokenizer
from loadgen.words import WORDS
from loadlens.contracts.packaged import UnknownName, packaged_names, resolve_packaged
from loadlens.contracts.yaml_document import Document, DocumentInvalid, Loc, Problem, dotted, fail, parse_yaml

PROFILE_DIR = Path(__file__).with_name("profiles")
SCHEMA_VERSION = 1

DEFAULT_CACHE_BLOCK_SIZE = 16
"""Tokens per KV-cache block the expected prefix-cache hit rate assumes unless the profile says otherwise
(``cache_block_size``): vLLM's default block size on GPUs, and the sim's."""


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    seed: int
    request_timeout_s: float
    stop_timeout_s: float
    traffic: tuple[Traffic, ...]
    stages: tuple[Stage, ...]
    source: str
    sha256: str
    users_scale: float = 1.0
    time_scale: float = 1.0
    cache_block_size: int = DEFAULT_CACHE_BLOCK_SIZE
    tokenizer: Tokenizer | None = field(default=None, compare=False)
    """Counts prompts (``tokenizer`` in the profile); None: the word scheme, a word a token."""

    @property
    def models(self) -> tuple[str, ...]:
        """Models named explicitly by traffic entries (the run's default model is added at run time)."""
        named = [t.model for t in self.traffic if t.model]
        named += [m for t in self.traffic for m, _ in t.adapters if m is not None]
        return tuple(dict.fromkeys(named))

    def scaled(self, *, users: float = 1.0, time: float = 1.0) -> Profile:
        """Users, open-loop rates and pools times ``users``; every duration times ``time``.

        ``until_requests`` is a count and is not scaled; a trace's instants scale with ``time``, not ``users``.
        """
        if not (users > 0 and math.isfinite(users)) or not (time > 0 and math.isfinite(time)):
            raise ProfileError("scale factors must be positive finite numbers")
        stages = []
        for s in self.stages:
            stages.append(
                replace(
                    s,
                    users=None if s.users is None else max(1, round(s.users * users)),
                    rate=None if s.rate is None else s.rate * users,
                    max_concurrency=max(1, round(s.max_concurrency * users)),
                    spawn_rate=None if s.spawn_rate is None else s.spawn_rate * users,
                    duration=None if s.duration is None else s.duration * time,
                    max_duration=s.max_duration * time,
                    trace=None if s.trace is None else replace(s.trace, time_scale=s.trace.time_scale * time),
                )
            )
        return replace(
            self, stages=tuple(stages), users_scale=self.users_scale * users, time_scale=self.time_scale * time
        )


# --- the schema --------------------------------------------------------------------------------------------------


def _non_empty_list(value: Any) -> Any:
    if not isinstance(value, list) or not value:
        raise fail("must be a non-empty list")
    return value


def _duplicates(names: list[str]) -> list[str]:
    return sorted({n for n in names if names.count(n) > 1})


class ProfileDocument(Section):
    """A profile file. Its traffic entries get ``defaults`` merged in (an entry's own keys win); the tokenizer
    is loaded once the document is valid."""

    version: int = Field(None, validate_default=True)
    name: Name = Field(None, validate_default=True)
    description: Any = ""
    defaults: dict[str, Any] = Field(default_factory=dict)
    traffic: Annotated[list[TrafficEntry], BeforeValidator(_non_empty_list)] = Field(None, validate_default=True)
    stages: Annotated[list[StageEntry], BeforeValidator(_non_empty_list)] = Field(None, validate_default=True)
    tokenizer: Any = None
    seed: int = 0
    request_timeout_s: Positive = 600.0
    stop_timeout_s: Annotated[float, BeforeValidator(lambda v: number(v, -1e-9))] = 30.0
    cache_block_size: Count = DEFAULT_CACHE_BLOCK_SIZE

    @classmethod
    def prepare(cls, value: dict[str, Any]) -> dict[str, Any]:
        defaults = value.get("defaults") or {}
        if not isinstance(defaults, dict):
            raise fail(f"must be a mapping, got {type(defaults).__name__}", "defaults")
        traffic = value.get("traffic")
        if defaults and isinstance(traffic, list):
            value["traffic"] = [{**defaults, **t} if isinstance(t, dict) else t for t in traffic]
        value["defaults"] = defaults
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> int:
        if value != SCHEMA_VERSION:
            raise fail(f"must be {SCHEMA_VERSION}, got {value!r}")
        return SCHEMA_VERSION

    @field_validator("traffic")
    @classmethod
    def _traffic_names(cls, traffic: list[TrafficEntry]) -> list[TrafficEntry]:
        dupes = _duplicates([t.name for t in traffic])
        if dupes:
            raise fail(f"duplicate names {dupes}")
        return traffic

    @field_validator("stages")
    @classmethod
    def _stage_names(cls, stages: list[StageEntry]) -> list[StageEntry]:
        expanded = [s for entry in stages for s in entry.stages()]
        dupes = _duplicates([s.name for s in expanded])
        if dupes:
            raise fail(f"duplicate names {dupes}")
        if all(s.warmup for s in expanded):
            raise fail("every stage is a warmup stage; nothing would be measured")
        return stages

    @field_validator("seed", mode="before")
    @classmethod
    def _seed(cls, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise fail(f"must be an integer >= 0, got {value!r}")
        return value

    @model_validator(mode="after")
    def _trace_traffic(self) -> ProfileDocument:
        """A trace row decides the whole prompt: no entry may add a dataset prompt, images, a prefix or turns."""
        if not any(s.trace is not None for s in self.stages):
            return self
        for i, t in enumerate(self.traffic):
            if t.prompt.source != "synthetic":
                raise fail("must be synthetic in a profile with a trace stage", "traffic", i, "prompt", "source")
            for key, present in (("images", t.images is not None and t.images.count > 0), ("prefix", t.prefix)):
                if present:
                    raise fail("not allowed in a profile with a trace stage (rows decide prompts)", "traffic", i, key)
            if t.conversation is not None:
                raise fail("not allowed in a profile with a trace stage", "traffic", i, "conversation")
        return self


_UNPREFIXED = {"version", "defaults", "traffic", "stages", "seed", "tokenizer"}


def _label(loc: Loc) -> str:
    """A field's printed path: the profile's own settings (and unknown top-level keys) read ``profile.KEY``."""
    text = dotted(loc)
    return text if not loc or loc[0] in _UNPREFIXED else f"profile.{text}"


def _message(problem: Problem, source: str) -> str:
    """``field.path: reason``; a document that is no mapping at all is named by its source."""
    return f"{problem.field}: {problem.reason}" if problem.loc else f"{source}: {problem.reason}"


# --- loading -----------------------------------------------------------------------------------------------------


def parse_profile(doc: Any, source: str = "<memory>", base: Path | None = None, sha256: str = "") -> Profile:
    """Validate a parsed YAML document. ``base`` resolves relative dataset paths."""
    return _parse(Document(doc), source, base, sha256)


def _parse(doc: Document, source: str, base: Path | None, sha256: str) -> Profile:
    try:
        spec = doc.validate(ProfileDocument, context={"base": base}, label=_label)
    except DocumentInvalid as err:
        raise ProfileError(_message(err.problem, source), err.problem) from None
    tokenizer = _tokenizer(spec.tokenizer, base)
    return Profile(
        name=spec.name,
        description=str(spec.description).strip(),
        seed=spec.seed,
        request_timeout_s=spec.request_timeout_s,
        stop_timeout_s=spec.stop_timeout_s,
        traffic=tuple(t.traffic() for t in spec.traffic),
        stages=tuple(s for entry in spec.stages for s in entry.stages()),
        source=source,
        sha256=sha256,
        cache_block_size=spec.cache_block_size,
        tokenizer=tokenizer,
    )


def _tokenizer(value: Any, base: Path | None) -> Tokenizer | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ProfileError(f"tokenizer: must be a path to tokenizer.json or a tokenizer directory, got {value!r}")
    path = Path(value)
    if not path.is_absolute() and base is not None:
        path = base / path
    if not path.exists():
        raise ProfileError(f"tokenizer: not found: {path}")
    try:
        tokenizer = load_tokenizer(path)
        ExactText(tokenizer, WORDS)  # refused before the run if too few prompt words are one token; warms it
    except TokenizerError as err:
        raise ProfileError(f"tokenizer: {err}") from None
    for endpoint in ("chat", "completions"):
        tokenizer.overhead(endpoint)  # measured now, not in the first request's time
    return tokenizer


def available_profiles() -> list[str]:
    return packaged_names(PROFILE_DIR)


def resolve_profile_path(name_or_path: str) -> Path:
    """A packaged profile name (``quick``) or a path to a YAML file (the rule of ``loadlens/contracts/packaged.py``)."""
    try:
        return resolve_packaged(name_or_path, PROFILE_DIR, "profile")
    except UnknownName as err:
        raise ProfileError(str(err)) from None


def load_profile(name_or_path: str) -> Profile:
    """Load and validate a profile by packaged name or path. Raises :class:`ProfileError`."""
    path = resolve_profile_path(name_or_path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ProfileError(f"cannot read profile {path}: {err.strerror}") from err
    try:
        doc = parse_yaml(raw, str(path))
    except yaml.YAMLError as err:
        raise ProfileError(f"{path}: not valid YAML: {err}") from err
    try:
        return _parse(doc, str(path), path.parent, hashlib.sha256(raw).hexdigest())
    except ProfileError as err:
        where = path.name  # the file's name, then the mistake's line and column where the document has them
        if err.problem is not None and err.problem.line is not None:
            where += f":{err.problem.line}:{err.problem.column}"
        raise ProfileError(f"profile {where}: {err}", err.problem) from err
