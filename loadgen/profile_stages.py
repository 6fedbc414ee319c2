"""A profile's stages: closed loop (``users``), open loop (``rate``), a trace replay (``trace``) or a closed
loop with spikes (``spikes``, expanded into baseline and spike stages). The runtime type (:class:`Stage`) and
the stage's schema (:class:`StageEntry`, whose ``stages()`` builds one or, with spikes, several).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from loadgen.profile_fields import NAME, Count, Flag, Name, OptCount, OptPositive, Positive, Section
from loadgen.profile_sources import Trace, TraceReplay
from loadlens.contracts.yaml_document import fail

Arrival = Literal["constant", "poisson"]


@dataclass(frozen=True)
class Stage:
    """One stage. Closed loop: ``users`` keep one request each in flight. Open loop: ``rate`` req/s arrive,
    or a ``trace``'s rows arrive at their recorded instants."""

    name: str
    warmup: bool = False
    users: int | None = None
    rate: float | None = None
    arrival: Arrival = "poisson"
    max_concurrency: int = 256
    spawn_rate: float | None = None
    duration: float | None = None
    until_requests: int | None = None
    max_duration: float = 600.0
    trace: TraceReplay | None = None

    @property
    def open_loop(self) -> bool:
        return self.rate is not None or self.trace is not None

    @property
    def user_count(self) -> int:
        """Locust users this stage needs: the closed-loop users, or the open-loop sender pool."""
        return self.max_concurrency if self.users is None else self.users

    def target(self) -> str:
        if self.trace is not None:
            t = self.trace
            return (
                f"trace {t.data.format} {len(t.rows)} rows over {t.span_s:.1f} s (x{t.speedup:g}, pool "
                f"{self.max_concurrency})"
            )
        if self.open_loop:
            return f"{self.rate:g} req/s {self.arrival} (pool {self.max_concurrency})"
        return f"{self.users} users"


# --- the schema --------------------------------------------------------------------------------------------------


class Spikes(Section):
    """``spikes: {count, baseline, duration, factor}``: baseline, spike, ..., baseline stages."""

    count: Count
    baseline: Positive
    duration: Positive
    factor: Positive


_TRACE_GIVES = "not allowed with trace (the trace gives the arrivals; the stage ends when every replayed row has "
_TRACE_GIVES += "finished, or at duration)"


class StageEntry(Section):
    """One entry of ``stages``. Which kind of stage it is decides which fields it may set (checked first, in
    ``prepare``); a trace or spikes are read before the stage's own fields."""

    spikes: Spikes | None = None
    trace: Trace | None = None
    name: Name = Field(None, validate_default=True)
    arrival: Arrival = "poisson"
    duration: OptPositive = None
    until_requests: OptCount = None
    warmup: Flag = False
    users: OptCount = None
    rate: OptPositive = None
    max_concurrency: Count = 256
    spawn_rate: OptPositive = None
    max_duration: Positive = 600.0

    @classmethod
    def prepare(cls, value: dict[str, Any]) -> dict[str, Any]:
        spikes = value.get("spikes")
        if spikes is not None:
            if not isinstance(spikes, dict) or not set(spikes) <= set(Spikes.model_fields):
                return value  # the spikes field reports it
            if value.get("users") is None:
                raise fail("needs a closed-loop stage (users)", "spikes")
            for key in ("duration", "until_requests", "warmup"):
                if value.get(key) not in (None, False):
                    raise fail("not allowed with spikes (the spikes define the stage lengths)", key)
            value.pop("duration", None)  # each expanded stage gets its own
        if value.get("trace") is not None:
            for key in ("users", "rate", "arrival", "until_requests"):
                if key in value:
                    raise fail(_TRACE_GIVES, key)
            return value
        if spikes is None and (not isinstance(value.get("name"), str) or not NAME.match(value["name"])):
            raise fail(f"must match {NAME.pattern} (a label value), got {value.get('name')!r}", "name")
        has_users, has_rate = value.get("users") is not None, value.get("rate") is not None
        if has_users == has_rate:
            raise fail("set exactly one of users (closed loop) or rate (open loop, req/s)")
        if has_users and ("arrival" in value or "max_concurrency" in value):
            raise fail("arrival and max_concurrency apply to open-loop (rate) stages only")
        if spikes is None and value.get("duration") is None and value.get("until_requests") is None:
            raise fail("set duration (seconds) or until_requests (completed requests), or both")
        return value

    @field_validator("arrival", mode="before")
    @classmethod
    def _arrival(cls, value: Any) -> Any:
        if value not in ("constant", "poisson"):
            raise fail(f"must be constant or poisson, got {value!r}")
        return value

    @model_validator(mode="after")
    def _lengths(self) -> StageEntry:
        if self.trace is not None and self.duration is None:
            replay = self.trace.replay()
            if replay.span_s >= self.max_duration:
                raise fail(
                    f"{self.max_duration:g} s is shorter than the replay ({replay.span_s:.1f} s of trace at speedup "
                    f"{replay.speedup:g}); raise it, or set duration to cut the replay",
                    "max_duration",
                )
        for name, _ in self._spike_plan():
            if not NAME.match(name):
                raise fail(f"must match {NAME.pattern} (a label value), got {name!r}", "name")
        return self

    def _spike_plan(self) -> list[tuple[str, bool]]:
        """(stage name, is a spike) of the expanded stages: baseline, spike, ..., baseline."""
        if self.spikes is None:
            return []
        n = self.spikes.count
        plan = [(f"{self.name}-{kind}-{i}", kind == "spike") for i in range(1, n + 1) for kind in ("baseline", "spike")]
        return [*plan, (f"{self.name}-baseline-{n + 1}", False)]

    def stages(self) -> list[Stage]:
        """The runtime stages: one, or with spikes every baseline and spike in order."""
        if self.trace is not None:
            replay = self.trace.replay()
            return [
                Stage(
                    name=self.name,
                    warmup=self.warmup,
                    arrival="constant",  # unused: the trace gives the instants
                    max_concurrency=self.max_concurrency,
                    spawn_rate=self.spawn_rate,
                    duration=self.duration,
                    until_requests=len(replay.rows),
                    max_duration=self.max_duration,
                    trace=replay,
                )
            ]
        one = Stage(
            name=self.name,
            warmup=self.warmup,
            users=self.users,
            rate=self.rate,
            arrival=self.arrival,
            max_concurrency=self.max_concurrency,
            spawn_rate=self.spawn_rate,
            duration=self.duration,
            until_requests=self.until_requests,
            max_duration=self.max_duration,
        )
        if self.spikes is None:
            return [one]
        assert self.users is not None  # spikes need a closed-loop stage
        spike_users = max(1, round(self.users * self.spikes.factor))
        out: list[Stage] = []
        for name, spike in self._spike_plan():
            out.append(
                replace(
                    one,
                    name=name,
                    users=spike_users if spike else self.users,
                    duration=self.spikes.duration if spike else self.spikes.baseline,
                )
            )
        return out
