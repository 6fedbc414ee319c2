"""Load profiles: named stages and a weighted traffic mix, loaded from YAML and validated before anything runs.

Usage::

    profile = load_profile("quick")                      # packaged: loadgen/profiles/quick.yaml
    profile = load_profile("my.yaml").scaled(users=0.5, time=0.1)
    profile.stages[0].name, profile.traffic[0].weight

Every problem raises :class:`ProfileError` whose message starts with the field path
(``stages[2].users: must be a positive integer, got 0``). The schema is documented in docs/loadgen.md.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

# ProfileError is raised by everything here; callers import it from this module.
from loadgen.profile_fields import ProfileError as ProfileError
from loadgen.profile_fields import boolean, check_keys, integer, mapping, number, opt_number
from loadgen.synthesis import ExactText
from loadgen.tokenizer import Tokenizer, TokenizerError, load_tokenizer
from loadgen.traces import FORMATS, MOONCAKE_BLOCK_TOKENS, TraceData, TraceError, TraceRow, detect_format, read_trace
from loadgen.words import WORDS
from loadlens.contracts.slo import PriorityClass, SLOConfig

PROFILE_DIR = Path(__file__).with_name("profiles")
SCHEMA_VERSION = 1

Endpoint = Literal["chat", "completions"]
Arrival = Literal["constant", "poisson"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
"""Stage and traffic names become Prometheus label values and file names: keep them short and plain."""


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: normal(mean, stdev) truncated to [min, max], rounded to an integer."""

    mean: float
    stdev: float = 0.0
    min: int = 1
    max: int = 1_000_000

    def sample(self, gauss: Any) -> int:
        """``gauss`` is ``random.Random.gauss``; a zero stdev is exact and draws nothing."""
        value = self.mean if self.stdev == 0 else gauss(self.mean, self.stdev)
        return int(min(self.max, max(self.min, round(value))))


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
class SecondsDist:
    """A duration distribution in seconds: normal(mean, stdev) truncated to [min, max]."""

    mean: float
    stdev: float = 0.0
    min: float = 0.0
    max: float = 3600.0

    def sample(self, gauss: Any) -> float:
        value = self.mean if self.stdev == 0 else gauss(self.mean, self.stdev)
        return float(min(self.max, max(self.min, value)))


@dataclass(frozen=True)
class ConversationSpec:
    """Multi-turn conversations (docs/loadgen.md, *Conversations*): ``turns`` requests per conversation, each
    carrying the conversation so far, with ``think_time_s`` between a reply and the next turn."""

    turns: LengthDist
    think_time_s: SecondsDist = field(default_factory=lambda: SecondsDist(0.0))


DEFAULT_CACHE_BLOCK_SIZE = 16
"""Tokens per KV-cache block the expected prefix-cache hit rate assumes unless the profile says otherwise
(``cache_block_size``): vLLM's default block size on GPUs, and the sim's."""

BASE_MODEL = "base"
"""In ``adapters``, the key that stands for the entry's ``model`` (else the run's model): the base model."""


@dataclass(frozen=True)
class PromptSpec:
    source: Literal["synthetic", "sharegpt"] = "synthetic"
    tokens: LengthDist = field(default_factory=lambda: LengthDist(256))
    path: Path | None = None


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


# --- parsing -------------------------------------------------------------------------------------------------


def _name(section: dict[str, Any], where: str) -> str:
    value = section.get("name")
    if not isinstance(value, str) or not _NAME.match(value):
        raise ProfileError(f"{where}.name: must match {_NAME.pattern} (a label value), got {value!r}")
    return value


def _length(value: Any, where: str) -> LengthDist:
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"mean": value}
    section = mapping(value, where)
    check_keys(section, {"mean", "stdev", "min", "max"}, where)
    mean = number(section, "mean", where)
    stdev = section.get("stdev", 0)
    if isinstance(stdev, bool) or not isinstance(stdev, int | float) or stdev < 0 or not math.isfinite(stdev):
        raise ProfileError(f"{where}.stdev: must be a number >= 0, got {stdev!r}")
    lo = integer(section, "min", where, 1)
    hi = integer(section, "max", where, 1_000_000)
    if lo > hi:
        raise ProfileError(f"{where}: min {lo} > max {hi}")
    if not lo <= mean <= hi:
        raise ProfileError(f"{where}.mean: {mean:g} is outside [min {lo}, max {hi}]")
    return LengthDist(mean=mean, stdev=float(stdev), min=lo, max=hi)


def _seconds(value: Any, where: str) -> SecondsDist:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = {"mean": value}
    section = mapping(value, where)
    check_keys(section, {"mean", "stdev", "min", "max"}, where)
    out: dict[str, float] = {}
    for key, default in (("mean", None), ("stdev", 0.0), ("min", 0.0), ("max", 3600.0)):
        raw = section.get(key, default)
        if raw is None:
            raise ProfileError(f"{where}.{key}: missing")
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw < 0:
            raise ProfileError(f"{where}.{key}: must be a number >= 0 (seconds), got {raw!r}")
        out[key] = float(raw)
    if out["min"] > out["max"]:
        raise ProfileError(f"{where}: min {out['min']:g} > max {out['max']:g}")
    if not out["min"] <= out["mean"] <= out["max"]:
        raise ProfileError(f"{where}.mean: {out['mean']:g} is outside [min {out['min']:g}, max {out['max']:g}]")
    return SecondsDist(**out)


def _conversation(value: Any, where: str) -> ConversationSpec:
    section = mapping(value, where)
    check_keys(section, {"turns", "think_time_s"}, where)
    if "turns" not in section:
        raise ProfileError(f"{where}.turns: missing (a number of turns or a {{mean, stdev, min, max}} distribution)")
    turns = _length(section["turns"], f"{where}.turns")
    return ConversationSpec(turns=turns, think_time_s=_seconds(section.get("think_time_s", 0), f"{where}.think_time_s"))


def _prefix(value: Any, where: str) -> Prefix:
    section = mapping(value, where)
    check_keys(section, {"count", "tokens", "groups"}, where)
    if section.get("groups") is None:
        return Prefix(integer(section, "count", where, 1), integer(section, "tokens", where))
    if "count" in section:
        raise ProfileError(f"{where}: set count (prefixes picked at random) or groups (stated shares), not both")
    raw = section["groups"]
    if not isinstance(raw, list) or not raw:
        raise ProfileError(f"{where}.groups: must be a non-empty list of {{share, tokens}}")
    default = integer(section, "tokens", where) if section.get("tokens") is not None else None
    shares: list[float] = []
    lengths: list[int] = []
    for i, item in enumerate(raw):
        gw = f"{where}.groups[{i}]"
        group = mapping(item, gw)
        check_keys(group, {"share", "tokens"}, gw)
        share = number(group, "share", gw)
        if share > 1:
            raise ProfileError(f"{gw}.share: must be in (0, 1], got {share:g}")
        if group.get("tokens") is None and default is None:
            raise ProfileError(f"{gw}.tokens: missing (set it here or in {where}.tokens)")
        shares.append(share)
        lengths.append(integer(group, "tokens", gw) if group.get("tokens") is not None else default)  # type: ignore[arg-type]
    if sum(shares) > 1 + 1e-9:
        raise ProfileError(f"{where}.groups: shares sum to {sum(shares):g}, more than 1")
    return Prefix(len(shares), default or lengths[0], tuple(shares), tuple(lengths))


def _adapters(value: Any, where: str) -> tuple[tuple[str | None, float], ...]:
    section = mapping(value, where)
    if not section:
        raise ProfileError(f"{where}: must name at least one model (adapter name: weight)")
    out: list[tuple[str | None, float]] = []
    for name in section:
        if not isinstance(name, str) or not name:
            raise ProfileError(f"{where}: model names must be non-empty strings, got {name!r}")
        out.append((None if name == BASE_MODEL else name, number(section, name, where)))
    return tuple(out)


def _prompt(value: Any, where: str, base: Path | None) -> PromptSpec:
    section = mapping(value, where)
    check_keys(section, {"source", "tokens", "path"}, where)
    source = section.get("source", "synthetic")
    if source == "synthetic":
        if "path" in section:
            raise ProfileError(f"{where}.path: only for source sharegpt")
        return PromptSpec("synthetic", _length(section.get("tokens", 256), f"{where}.tokens"))
    if source == "sharegpt":
        raw = section.get("path")
        if not isinstance(raw, str) or not raw:
            raise ProfileError(f"{where}.path: a ShareGPT JSON file is required for source sharegpt")
        path = Path(raw)
        if not path.is_absolute() and base is not None:
            path = base / path
        if not path.is_file():
            raise ProfileError(f"{where}.path: file not found: {path}")
        return PromptSpec("sharegpt", LengthDist(1), path)
    raise ProfileError(f"{where}.source: must be synthetic or sharegpt, got {source!r}")


def _traffic(value: Any, where: str, defaults: dict[str, Any], base: Path | None) -> Traffic:
    section = {**defaults, **mapping(value, where)}
    allowed = {
        "name",
        "weight",
        "endpoint",
        "model",
        "priority",
        "prompt",
        "output_tokens",
        "ignore_eos",
        "temperature",
        "images",
        "prefix",
        "class",
        "conversation",
        "adapters",
    }
    check_keys(section, allowed, where)
    endpoint = section.get("endpoint", "chat")
    if endpoint not in ("chat", "completions"):
        raise ProfileError(f"{where}.endpoint: must be chat or completions, got {endpoint!r}")
    model = section.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise ProfileError(f"{where}.model: must be a non-empty string, got {model!r}")
    priority = section.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ProfileError(f"{where}.priority: must be an integer, got {priority!r}")
    priority_class = section.get("class")
    if priority_class is not None and (not isinstance(priority_class, str) or not _NAME.match(priority_class)):
        raise ProfileError(f"{where}.class: must be an SLO class name, got {priority_class!r}")
    prompt = _prompt(section.get("prompt", {}), f"{where}.prompt", base)
    raw_out = section.get("output_tokens", 128)
    from_dataset = raw_out == "dataset"
    if from_dataset and prompt.source != "sharegpt":
        raise ProfileError(f"{where}.output_tokens: 'dataset' needs prompt.source sharegpt")
    temperature = section.get("temperature", 0.0)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
        raise ProfileError(f"{where}.temperature: must be a number in [0, 2], got {temperature!r}")
    images = Images()
    if section.get("images") is not None:
        isec = mapping(section["images"], f"{where}.images")
        check_keys(isec, {"count", "width", "height"}, f"{where}.images")
        images = Images(
            count=integer(isec, "count", f"{where}.images", 1, lo=0),
            width=integer(isec, "width", f"{where}.images", 512),
            height=integer(isec, "height", f"{where}.images", 512),
        )
        if images.width > 8192 or images.height > 8192:
            raise ProfileError(f"{where}.images: width and height must be <= 8192")
        if images.count and endpoint != "chat":
            raise ProfileError(f"{where}.images: image parts need endpoint chat")
    prefix = None if section.get("prefix") is None else _prefix(section["prefix"], f"{where}.prefix")
    conversation = None
    if section.get("conversation") is not None:
        conversation = _conversation(section["conversation"], f"{where}.conversation")
        if prompt.source != "synthetic":
            raise ProfileError(f"{where}.conversation: needs prompt.source synthetic (later turns are synthetic text)")
        if images.count:
            raise ProfileError(f"{where}.conversation: images are not supported in conversations")
    adapters = () if section.get("adapters") is None else _adapters(section["adapters"], f"{where}.adapters")
    return Traffic(
        name=_name(section, where),
        weight=number(section, "weight", where, 1.0),
        endpoint=endpoint,
        model=model,
        priority=priority,
        prompt=prompt,
        output_tokens=None if from_dataset else _length(raw_out, f"{where}.output_tokens"),
        output_from_dataset=from_dataset,
        ignore_eos=boolean(section, "ignore_eos", where, True),
        temperature=float(temperature),
        images=images,
        prefix=prefix,
        priority_class=priority_class,
        conversation=conversation,
        adapters=adapters,
    )


_STAGE_KEYS = {
    "name",
    "warmup",
    "users",
    "rate",
    "arrival",
    "max_concurrency",
    "spawn_rate",
    "duration",
    "until_requests",
    "max_duration",
    "spikes",
    "trace",
}
_TRACE_KEYS = {"path", "format", "speedup", "start", "end", "limit", "block_size", "model", "output_tokens"}


def _trace(value: Any, where: str, base: Path | None) -> TraceReplay:
    section = mapping(value, where)
    check_keys(section, _TRACE_KEYS, where)
    raw = section.get("path")
    if not isinstance(raw, str) or not raw:
        raise ProfileError(f"{where}.path: a trace file is required (Mooncake JSONL, BurstGPT or Azure CSV)")
    path = Path(raw)
    if not path.is_absolute() and base is not None:
        path = base / path
    if not path.is_file():
        raise ProfileError(f"{where}.path: file not found: {path}")
    fmt = section.get("format", "auto")
    if fmt not in (*FORMATS, "auto"):
        raise ProfileError(f"{where}.format: must be auto, {', '.join(FORMATS)}, got {fmt!r}")
    start = section.get("start", 0)
    if isinstance(start, bool) or not isinstance(start, int | float) or not math.isfinite(start) or start < 0:
        raise ProfileError(f"{where}.start: must be a number of seconds >= 0, got {start!r}")
    end = opt_number(section, "end", where)
    if end is not None and end <= start:
        raise ProfileError(f"{where}.end: must be after start ({start:g} s), got {end:g}")
    limit = None if section.get("limit") is None else integer(section, "limit", where)
    block_size = integer(section, "block_size", where, MOONCAKE_BLOCK_TOKENS)
    model = section.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise ProfileError(f"{where}.model: must be a BurstGPT model name (ChatGPT, GPT-4), got {model!r}")
    raw_out = section.get("output_tokens", "trace")
    output = None if raw_out == "trace" else _length(raw_out, f"{where}.output_tokens")
    try:
        resolved = detect_format(path) if fmt == "auto" else fmt
        if model is not None and resolved != "burstgpt":
            raise ProfileError(f"{where}.model: only BurstGPT traces name a model per row (this one is {resolved})")
        if "block_size" in section and resolved != "mooncake":
            raise ProfileError(f"{where}.block_size: only Mooncake traces have block hashes (this one is {resolved})")
        data = read_trace(
            path, resolved, start=float(start), end=end, limit=limit, block_tokens=block_size, model=model
        )
    except TraceError as err:
        raise ProfileError(f"{where}.path: {err}") from None
    return TraceReplay(
        data=data,
        path=raw,
        speedup=number(section, "speedup", where, 1.0),
        output_tokens=output,
        block_size=block_size,
        start=float(start),
        end=end,
        limit=limit,
        model=model,
    )


def _trace_stage(section: dict[str, Any], where: str, base: Path | None) -> Stage:
    """A stage whose arrivals and lengths come from a trace: open loop, ending once every row has finished."""
    for key in ("users", "rate", "arrival", "until_requests"):
        if key in section:
            raise ProfileError(
                f"{where}.{key}: not allowed with trace (the trace gives the arrivals; the stage ends when every "
                "replayed row has finished, or at duration)"
            )
    trace = _trace(section["trace"], f"{where}.trace", base)
    duration = opt_number(section, "duration", where)
    max_duration = number(section, "max_duration", where, 600.0)
    if duration is None and trace.span_s >= max_duration:
        raise ProfileError(
            f"{where}.max_duration: {max_duration:g} s is shorter than the replay ({trace.span_s:.1f} s of trace at "
            f"speedup {trace.speedup:g}); raise it, or set duration to cut the replay"
        )
    return Stage(
        name=_name(section, where),
        warmup=boolean(section, "warmup", where, False),
        arrival="constant",  # unused: the trace gives the instants
        max_concurrency=integer(section, "max_concurrency", where, 256),
        spawn_rate=opt_number(section, "spawn_rate", where),
        duration=duration,
        until_requests=len(trace.rows),
        max_duration=max_duration,
        trace=trace,
    )


def _stage(section: dict[str, Any], where: str, base: Path | None = None) -> Stage:
    check_keys(section, _STAGE_KEYS, where)
    if section.get("trace") is not None:
        return _trace_stage(section, where, base)
    name = _name(section, where)
    has_users, has_rate = section.get("users") is not None, section.get("rate") is not None
    if has_users == has_rate:
        raise ProfileError(f"{where}: set exactly one of users (closed loop) or rate (open loop, req/s)")
    if has_users and ("arrival" in section or "max_concurrency" in section):
        raise ProfileError(f"{where}: arrival and max_concurrency apply to open-loop (rate) stages only")
    arrival = section.get("arrival", "poisson")
    if arrival not in ("constant", "poisson"):
        raise ProfileError(f"{where}.arrival: must be constant or poisson, got {arrival!r}")
    duration = opt_number(section, "duration", where)
    until = None if section.get("until_requests") is None else integer(section, "until_requests", where)
    if duration is None and until is None:
        raise ProfileError(f"{where}: set duration (seconds) or until_requests (completed requests), or both")
    return Stage(
        name=name,
        warmup=boolean(section, "warmup", where, False),
        users=integer(section, "users", where) if has_users else None,
        rate=number(section, "rate", where) if has_rate else None,
        arrival=arrival,
        max_concurrency=integer(section, "max_concurrency", where, 256),
        spawn_rate=opt_number(section, "spawn_rate", where),
        duration=duration,
        until_requests=until,
        max_duration=number(section, "max_duration", where, 600.0),
    )


def _expand_spikes(section: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """``spikes: {count, baseline, duration, factor}`` → baseline/spike/.../baseline stages."""
    spikes = mapping(section["spikes"], f"{where}.spikes")
    check_keys(spikes, {"count", "baseline", "duration", "factor"}, f"{where}.spikes")
    if section.get("users") is None:
        raise ProfileError(f"{where}.spikes: needs a closed-loop stage (users)")
    for key in ("duration", "until_requests", "warmup"):
        if section.get(key) not in (None, False):
            raise ProfileError(f"{where}.{key}: not allowed with spikes (the spikes define the stage lengths)")
    count = integer(spikes, "count", f"{where}.spikes")
    baseline = number(spikes, "baseline", f"{where}.spikes")
    spike_s = number(spikes, "duration", f"{where}.spikes")
    factor = number(spikes, "factor", f"{where}.spikes")
    users = integer(section, "users", where)
    name = _name(section, where)
    rest = {k: v for k, v in section.items() if k not in ("spikes", "name", "users")}
    out: list[dict[str, Any]] = []
    for i in range(1, count + 1):
        out.append({**rest, "name": f"{name}-baseline-{i}", "users": users, "duration": baseline})
        out.append({**rest, "name": f"{name}-spike-{i}", "users": max(1, round(users * factor)), "duration": spike_s})
    out.append({**rest, "name": f"{name}-baseline-{count + 1}", "users": users, "duration": baseline})
    return out


def parse_profile(doc: Any, source: str = "<memory>", base: Path | None = None, sha256: str = "") -> Profile:
    """Validate a parsed YAML document. ``base`` resolves relative dataset paths."""
    top = mapping(doc, source)
    check_keys(
        top,
        {
            "version",
            "name",
            "description",
            "seed",
            "defaults",
            "traffic",
            "stages",
            "request_timeout_s",
            "stop_timeout_s",
            "cache_block_size",
            "tokenizer",
        },
        "profile",
    )
    if top.get("version") != SCHEMA_VERSION:
        raise ProfileError(f"version: must be {SCHEMA_VERSION}, got {top.get('version')!r}")
    name = _name(top, "profile")
    defaults = mapping(top.get("defaults") or {}, "defaults")
    raw_traffic = top.get("traffic")
    if not isinstance(raw_traffic, list) or not raw_traffic:
        raise ProfileError("traffic: must be a non-empty list")
    traffic = tuple(_traffic(t, f"traffic[{i}]", defaults, base) for i, t in enumerate(raw_traffic))
    names = [t.name for t in traffic]
    if len(set(names)) != len(names):
        raise ProfileError(f"traffic: duplicate names {sorted({n for n in names if names.count(n) > 1})}")
    raw_stages = top.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise ProfileError("stages: must be a non-empty list")
    stages: list[Stage] = []
    for i, raw in enumerate(raw_stages):
        where = f"stages[{i}]"
        section = mapping(raw, where)
        expanded = _expand_spikes(section, where) if section.get("spikes") is not None else [section]
        stages.extend(_stage(s, where, base) for s in expanded)
    stage_names = [s.name for s in stages]
    if len(set(stage_names)) != len(stage_names):
        raise ProfileError(f"stages: duplicate names {sorted({n for n in stage_names if stage_names.count(n) > 1})}")
    if all(s.warmup for s in stages):
        raise ProfileError("stages: every stage is a warmup stage; nothing would be measured")
    if any(s.trace is not None for s in stages):
        _check_trace_traffic(traffic)
    tokenizer = _tokenizer(top.get("tokenizer"), base)
    seed = top.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ProfileError(f"seed: must be an integer >= 0, got {seed!r}")
    description = top.get("description", "")
    return Profile(
        name=name,
        description=str(description).strip(),
        seed=seed,
        request_timeout_s=number(top, "request_timeout_s", "profile", 600.0),
        stop_timeout_s=number(top, "stop_timeout_s", "profile", 30.0, lo=-1e-9),
        traffic=traffic,
        stages=tuple(stages),
        source=source,
        sha256=sha256,
        cache_block_size=integer(top, "cache_block_size", "profile", DEFAULT_CACHE_BLOCK_SIZE),
        tokenizer=tokenizer,
    )


def _check_trace_traffic(traffic: tuple[Traffic, ...]) -> None:
    """A trace row decides the whole prompt: no entry may add a dataset prompt, images, a prefix or turns."""
    for i, t in enumerate(traffic):
        where = f"traffic[{i}]"
        if t.prompt.source != "synthetic":
            raise ProfileError(f"{where}.prompt.source: must be synthetic in a profile with a trace stage")
        for key, present in (("images", t.images.count > 0), ("prefix", t.prefix is not None)):
            if present:
                raise ProfileError(f"{where}.{key}: not allowed in a profile with a trace stage (rows decide prompts)")
        if t.conversation is not None:
            raise ProfileError(f"{where}.conversation: not allowed in a profile with a trace stage")


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
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def resolve_profile_path(name_or_path: str) -> Path:
    """A packaged profile name (``quick``) or a path to a YAML file."""
    if name_or_path and _NAME.match(name_or_path) and not name_or_path.endswith((".yaml", ".yml")):
        packaged = PROFILE_DIR / f"{name_or_path}.yaml"
        if packaged.is_file():
            return packaged
        raise ProfileError(f"unknown profile {name_or_path!r} (packaged: {', '.join(available_profiles())})")
    path = Path(name_or_path)
    if not path.is_file():
        raise ProfileError(f"profile file not found: {name_or_path}")
    return path


def load_profile(name_or_path: str) -> Profile:
    """Load and validate a profile by packaged name or path. Raises :class:`ProfileError`."""
    path = resolve_profile_path(name_or_path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ProfileError(f"cannot read profile {path}: {err.strerror}") from err
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise ProfileError(f"{path}: not valid YAML: {err}") from err
    try:
        return parse_profile(doc, str(path), base=path.parent, sha256=hashlib.sha256(raw).hexdigest())
    except ProfileError as err:
        raise ProfileError(f"profile {path.name}: {err}") from err
