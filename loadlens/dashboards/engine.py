"""The serving dashboard's engine queries in one metric dialect (vLLM's or sglang's).

Panels name the vLLM series they chart; :class:`EngineView` turns each into the dialect's series through
``loadlens.contracts.engine_series`` (the one mapping). A target whose series has no counterpart is left
out, and the panel's description says so; a panel left with no target is left out of the view, and the
view remembers why (the dashboard's description lists it). Nothing is drawn as a stand-in zero.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from loadlens.contracts.engine_series import BY_VLLM, Dialect
from loadlens.dashboards import model
from loadlens.dashboards.model import Panel, Target


@dataclass(frozen=True)
class Series:
    """One engine series of one dialect, with the label matchers that select the fact."""

    name: str
    matchers: str = ""
    labels: tuple[tuple[str, str], ...] = ()

    def sel(self, base: str) -> str:
        return f"{base}, {self.matchers}" if self.matchers else base

    def _labelled(self, expr: str) -> str:
        for key, value in self.labels:
            expr = f'label_replace({expr}, "{key}", "{value}", "", "")'
        return expr

    def gauge(self, base: str) -> str:
        return self._labelled(f"{self.name}{{{self.sel(base)}}}")

    def rate(self, base: str) -> str:
        return self._labelled(model.rate(self.name, self.sel(base)))

    def quantile(self, q: float, base: str, by: str = "") -> str:
        assert not self.labels, "constant labels are for counters and gauges"
        return model.quantile(q, self.name, self.sel(base), by)

    def mean(self, base: str, by: str = "") -> str:
        assert not self.labels, "constant labels are for counters and gauges"
        return model.mean(self.name, self.sel(base), by)


@dataclass(frozen=True)
class Drawn:
    """A target drawn from the engine series named by its vLLM name."""

    vllm: str
    target: Target


@dataclass(frozen=True)
class Absent:
    """A target the dialect cannot draw: its vLLM series has no counterpart."""

    vllm: str
    legend: str


@dataclass
class EngineView:
    dialect: Dialect
    # (panel title, why) of every panel this view leaves out.
    absent_panels: list[tuple[str, str]] = field(default_factory=list)

    def series(self, vllm: str) -> Series | None:
        entry = BY_VLLM[vllm]
        if self.dialect == "vllm":
            return Series(vllm, entry.vllm_matchers)
        if entry.sglang is None:
            return None
        return Series(entry.sglang.name, entry.sglang.matchers, entry.sglang.labels)

    def target(self, vllm: str, expr: Callable[[Series], str], legend: str) -> Drawn | Absent:
        series = self.series(vllm)
        return Absent(vllm, legend) if series is None else Drawn(vllm, Target(expr(series), legend))

    def panel(self, panel: Panel, targets: Sequence[Target | Drawn | Absent]) -> Panel | None:
        """``panel`` with the targets this dialect can draw; None (and remembered) when none is left.

        Outside vLLM's dialect the description names the series drawn and what has no counterpart.
        """
        drawn = tuple(t.target if isinstance(t, Drawn) else t for t in targets if not isinstance(t, Absent))
        notes = []
        if self.dialect != "vllm":
            for vllm in dict.fromkeys(t.vllm for t in targets if isinstance(t, Drawn)):
                entry = BY_VLLM[vllm]
                assert entry.sglang is not None
                notes.append(f"On {self.dialect}: {entry.sglang.name} for {vllm} ({entry.note}).")
        legends: dict[str, list[str]] = {}
        for t in targets:
            if isinstance(t, Absent):
                legends.setdefault(t.vllm, []).append(t.legend)
        for vllm, names in legends.items():
            notes.append(f"{vllm} ({', '.join(names)}) has no {self.dialect} counterpart: {BY_VLLM[vllm].note}.")
        if not drawn:
            self.absent_panels.append((panel.title, " ".join(notes)))
            return None
        description = " ".join([panel.description, *notes]) if notes else panel.description
        return replace(panel, targets=drawn, description=description)
