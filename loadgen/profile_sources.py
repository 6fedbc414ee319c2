"""Where a profile's requests come from besides its own numbers: a traffic entry's prompts (synthetic text or
a ShareGPT file) and a stage's trace (docs/loadgen.md, *Prompts* and *Trace replay*).

Both name files; a relative path is relative to the profile's directory (the validation context's ``base``),
and a file that is missing or broken is reported at its field (``stages[0].trace.path: file not found: ...``).
A trace is read while the profile is validated, so a broken row stops the run before it starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from loadgen.profile_fields import Count, Length, LengthDist, OptCount, OptPositive, Positive, Section, not_null
from loadgen.traces import FORMATS, MOONCAKE_BLOCK_TOKENS, TraceData, TraceError, TraceRow, detect_format, read_trace
from loadlens.contracts.yaml_document import fail


def resolve(raw: str, info: ValidationInfo) -> Path:
    """``raw`` relative to the profile's directory (``base`` in the validation context), if it has one."""
    path = Path(raw)
    base = (info.context or {}).get("base")
    return base / path if not path.is_absolute() and base is not None else path


# --- prompts -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptSpec:
    source: Literal["synthetic", "sharegpt"] = "synthetic"
    tokens: LengthDist = field(default_factory=lambda: LengthDist(256))
    path: Path | None = None


class Prompt(Section):
    """A traffic entry's ``prompt``: ``source`` synthetic (``tokens`` long) or sharegpt (``path``)."""

    source: Literal["synthetic", "sharegpt"] = "synthetic"
    tokens: Length = Field(default_factory=lambda: Length(mean=256))
    path: Path | None = Field(None, validate_default=True)

    @classmethod
    def prepare(cls, value: dict[str, Any]) -> dict[str, Any]:
        source = value.get("source", "synthetic")
        if source == "synthetic" and "path" in value:
            raise fail("only for source sharegpt", "path")
        if source == "sharegpt":
            value.pop("tokens", None)  # a ShareGPT conversation decides its own length
        return value

    @field_validator("source", mode="before")
    @classmethod
    def _source(cls, value: Any) -> Any:
        if value not in ("synthetic", "sharegpt"):
            raise fail(f"must be synthetic or sharegpt, got {value!r}")
        return value

    @field_validator("path", mode="before")
    @classmethod
    def _file(cls, value: Any, info: ValidationInfo) -> Path | None:
        if info.data.get("source") != "sharegpt":
            return None
        if not isinstance(value, str) or not value:
            raise fail("a ShareGPT JSON file is required for source sharegpt")
        path = resolve(value, info)
        if not path.is_file():
            raise fail(f"file not found: {path}")
        return path

    def spec(self) -> PromptSpec:
        if self.source == "sharegpt":
            return PromptSpec("sharegpt", LengthDist(1), self.path)
        return PromptSpec("synthetic", self.tokens.dist())


# --- traces ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceReplay:
    """A stage's trace (docs/loadgen.md, *Trace replay*): its rows arrive at their recorded offsets divided by
    ``speedup`` and times the profile's time scale, each with the row's prompt and output lengths."""

    data: TraceData
    path: str
    """As the profile wrote it (``data.path`` is resolved)."""
    speedup: float = 1.0
    time_scale: float = 1.0
    """The profile's ``--time-scale``: replay instants stretch with every other duration."""
    output_tokens: LengthDist | None = None
    """None: each row's recorded output length; else ``max_tokens`` drawn from this distribution."""
    block_size: int = MOONCAKE_BLOCK_TOKENS
    start: float = 0.0
    end: float | None = None
    limit: int | None = None
    model: str | None = None

    @property
    def rows(self) -> tuple[TraceRow, ...]:
        return self.data.rows

    def offset(self, row: TraceRow) -> float:
        """Seconds after the stage's start that ``row`` is due."""
        return row.at / self.speedup * self.time_scale

    @property
    def span_s(self) -> float:
        """Seconds from the first replayed row to the last, as replayed."""
        return self.data.span / self.speedup * self.time_scale

    @property
    def mean_rate(self) -> float | None:
        """Requests per second the replay offers on average (None for a single row or a zero span)."""
        span = self.span_s
        return (len(self.rows) - 1) / span if span > 0 and len(self.rows) > 1 else None


def _start(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise fail(f"must be a number of seconds >= 0, got {value!r}")
    return float(value)


class Trace(Section):
    """A stage's ``trace``: the file, which part of it, and how fast. Validating it reads the rows."""

    path: str = Field(None, validate_default=True)
    format: str = "auto"
    start: Annotated[float, BeforeValidator(_start)] = 0.0
    end: OptPositive = None
    limit: OptCount = None
    block_size: Count = MOONCAKE_BLOCK_TOKENS
    model: str | None = None
    output_tokens: Annotated[Length | None, BeforeValidator(not_null)] = None
    """None (``trace``, the default): each row's recorded output length."""
    speedup: Positive = 1.0
    _data: TraceData | None = PrivateAttr(None)

    @classmethod
    def prepare(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("output_tokens", "trace") == "trace":
            value.pop("output_tokens", None)
        return value

    @field_validator("path", mode="before")
    @classmethod
    def _file(cls, value: Any, info: ValidationInfo) -> str:
        if not isinstance(value, str) or not value:
            raise fail("a trace file is required (Mooncake JSONL, BurstGPT or Azure CSV)")
        if not resolve(value, info).is_file():
            raise fail(f"file not found: {resolve(value, info)}")
        return value

    @field_validator("format", mode="before")
    @classmethod
    def _format(cls, value: Any) -> Any:
        if value not in (*FORMATS, "auto"):
            raise fail(f"must be auto, {', '.join(FORMATS)}, got {value!r}")
        return value

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, value: Any) -> Any:
        if value is not None and (not isinstance(value, str) or not value):
            raise fail(f"must be a BurstGPT model name (ChatGPT, GPT-4), got {value!r}")
        return value

    @model_validator(mode="after")
    def _read(self, info: ValidationInfo) -> Trace:
        if self.end is not None and self.end <= self.start:
            raise fail(f"must be after start ({self.start:g} s), got {self.end:g}", "end")
        path = resolve(self.path, info)
        try:
            resolved = detect_format(path) if self.format == "auto" else self.format
            if self.model is not None and resolved != "burstgpt":
                raise fail(f"only BurstGPT traces name a model per row (this one is {resolved})", "model")
            if "block_size" in self.model_fields_set and resolved != "mooncake":
                raise fail(f"only Mooncake traces have block hashes (this one is {resolved})", "block_size")
            self._data = read_trace(
                path,
                resolved,  # type: ignore[arg-type]  # checked against FORMATS above
                start=self.start,
                end=self.end,
                limit=self.limit,
                block_tokens=self.block_size,
                model=self.model,
            )
        except TraceError as err:
            raise fail(str(err), "path") from None
        return self

    def replay(self) -> TraceReplay:
        assert self._data is not None  # read by the validator
        return TraceReplay(
            data=self._data,
            path=self.path,
            speedup=self.speedup,
            output_tokens=None if self.output_tokens is None else self.output_tokens.dist(),
            block_size=self.block_size,
            start=self.start,
            end=self.end,
            limit=self.limit,
            model=self.model,
        )
