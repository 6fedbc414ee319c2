"""PNG charts of one panel's series: title, unit on the y axis, SLO/threshold lines, stage bands, legend.

Matplotlib with the Agg backend and its bundled DejaVu fonts only (no network, no system font lookup).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from loadlens.report.queries import FiredAlert, RefLine, Series, Stage

MAX_SERIES = 12
_BAND_COLOURS = ("#e8eef7", "#f6f1e4")
_WARMUP_COLOUR = "#eeeeee"
# Reference lines are red/purple and dashed; data lines use the rest of tab10 so they never look alike.
_REF_COLOURS = ("#d62728", "#9467bd", "#8c564b", "#e377c2")
_DATA_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#17becf", "#7f7f7f", "#bcbd22",
    "#393b79", "#637939", "#8c6d31", "#6baed6", "#fdae6b", "#74c476",
)  # fmt: skip
# Firing alerts: a translucent span over the plot and a solid strip along its bottom, coloured by severity.
ALERT_COLOURS = {"critical": "#d62728", "warning": "#ff7f0e"}
ALERT_OTHER_COLOUR = "#8c564b"
ALERT_ALPHA = 0.12
ALERT_STRIP = 0.035  # height of the bottom strip, as a fraction of the axes
# A reference line more than this many times above the data's peak is listed, not drawn (it would flatten it).
OFF_SCALE_FACTOR = 3.0


@dataclass(frozen=True)
class Unit:
    """How a Grafana unit is shown: axis label and the factor from the panel's unit to the shown one."""

    label: str
    factor: float = 1.0
    suffix: str = ""


_UNITS: dict[str, Unit] = {
    "s": Unit("milliseconds (ms)", 1000.0, " ms"),
    "bytes": Unit("GiB", 1.0 / 2**30, " GiB"),
    "percentunit": Unit("percent (%)", 100.0, " %"),
    "reqps": Unit("requests / s", 1.0, " req/s"),
    "suffix:tok/s": Unit("tokens / s", 1.0, " tok/s"),
    "short": Unit("count"),
    "ops": Unit("operations / s", 1.0, " /s"),
    "watt": Unit("watts (W)", 1.0, " W"),
    "celsius": Unit("degrees Celsius (°C)", 1.0, " °C"),
    "hertz": Unit("MHz", 1e-6, " MHz"),
    "bool_on_off": Unit("active (1 = yes)"),
}


def unit_for(grafana_unit: str) -> Unit:
    return _UNITS.get(grafana_unit, Unit(grafana_unit or "value"))


def drop_all_zero(series: Sequence[Series], boolean: bool = False) -> tuple[list[Series], int]:
    """Series that are 0 throughout (error counters that never moved, states never on) only crowd the legend:
    drop them and count them. When every series is 0 the flat lines are the message and stay (except states)."""
    nonzero = [s for s in series if any(v != 0 for v in s.values)]
    if nonzero or boolean:
        return nonzero, len(series) - len(nonzero)
    return list(series), 0


def _top_series(series: Sequence[Series], limit: int) -> tuple[list[Series], int]:
    """The ``limit`` series with the largest mean (the rest are counted in the legend title)."""
    if len(series) <= limit:
        return list(series), 0
    ranked = sorted(series, key=lambda s: -sum(s.values) / len(s.values))
    return ranked[:limit], len(series) - limit


def alert_colour(severity: str) -> str:
    return ALERT_COLOURS.get(severity, ALERT_OTHER_COLOUR)


def render(
    title: str,
    grafana_unit: str,
    series: Sequence[Series],
    *,
    start: float,
    end: float,
    stages: Sequence[Stage] = (),
    alerts: Sequence[FiredAlert] = (),
    ref_lines: Sequence[RefLine] = (),
    stacked: bool = False,
    y_min: float | None = None,
    y_max: float | None = None,
    dpi: int = 100,
) -> bytes:
    """One PNG (bytes) of :func:`figure`."""
    fig = figure(
        title,
        grafana_unit,
        series,
        start=start,
        end=end,
        stages=stages,
        alerts=alerts,
        ref_lines=ref_lines,
        stacked=stacked,
        y_min=y_min,
        y_max=y_max,
        dpi=dpi,
    )
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def figure(
    title: str,
    grafana_unit: str,
    series: Sequence[Series],
    *,
    start: float,
    end: float,
    stages: Sequence[Stage] = (),
    alerts: Sequence[FiredAlert] = (),
    ref_lines: Sequence[RefLine] = (),
    stacked: bool = False,
    y_min: float | None = None,
    y_max: float | None = None,
    dpi: int = 100,
) -> Figure:
    """One chart. X: seconds since ``start``; y: the panel's unit scaled for reading (ms, GiB, %); stage bands
    behind the data, firing alerts shaded over them (named in the legend)."""
    unit = unit_for(grafana_unit)
    fig = Figure(figsize=(9.6, 4.4), dpi=dpi)
    ax = fig.add_subplot()
    span = max(end - start, 1.0)
    minutes = span > 900
    xscale = 60.0 if minutes else 1.0

    def x(t: float) -> float:
        return (t - start) / xscale

    for i, st in enumerate(stages):
        lo, hi = max(st.start, start), min(st.end, end)
        if hi <= lo:
            continue
        colour = _WARMUP_COLOUR if st.warmup else _BAND_COLOURS[i % 2]
        ax.axvspan(x(lo), x(hi), color=colour, zorder=0, linewidth=0)
        ax.axvline(x(lo), color="#9aa5b1", linewidth=0.6, zorder=1)
        ax.text(
            (x(lo) + x(hi)) / 2,
            0.985,
            st.name if not st.warmup or "warmup" in st.name else f"{st.name} (warmup)",
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="top",
            fontsize=8,
            color="#3b4a5a",
            clip_on=True,
            zorder=6,
            bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.7, "linewidth": 0},
        )

    for alert in alerts:
        lo, hi = max(alert.start, start), min(alert.end, end)
        if hi <= lo:
            continue
        colour = alert_colour(alert.severity)
        ax.axvspan(x(lo), x(hi), color=colour, alpha=ALERT_ALPHA, zorder=1.5, linewidth=0)
        ax.axvspan(x(lo), x(hi), ymin=0.0, ymax=ALERT_STRIP, color=colour, zorder=5, linewidth=0)

    boolean = grafana_unit == "bool_on_off"
    series, always_off = drop_all_zero(series, boolean)
    shown, hidden = _top_series(series, MAX_SERIES)
    ax.set_prop_cycle(color=list(_DATA_COLOURS))
    if stacked and shown:
        # Stack on a common grid: the union of timestamps, missing points as 0.
        grid = sorted({t for s in shown for t in s.times})
        rows = []
        for s in shown:
            lookup = dict(zip(s.times, s.values, strict=True))
            rows.append([lookup.get(t, 0.0) * unit.factor for t in grid])
        ax.stackplot([x(t) for t in grid], rows, labels=[s.name for s in shown], alpha=0.75, zorder=2)
    else:
        for s in shown:
            ax.plot(
                [x(t) for t in s.times],
                [v * unit.factor for v in s.values],
                label=s.name,
                linewidth=1.4,
                zorder=3,
                drawstyle="steps-post" if boolean else "default",
            )

    peak = max((v * unit.factor for s in shown for v in s.values), default=0.0)
    if stacked and shown:
        peak = sum(max(s.values) for s in shown) * unit.factor
    if y_max is not None:
        peak = max(peak, y_max * unit.factor)
    drawn = 0
    for i, ref in enumerate(sorted(ref_lines, key=lambda r: r.value)):
        value = ref.value * unit.factor
        colour = _REF_COLOURS[i % len(_REF_COLOURS)]
        text = f"{ref.label} = {_fmt(value)}{unit.suffix}"
        if drawn and peak > 0 and value > OFF_SCALE_FACTOR * peak:
            # Listed in the legend as off scale rather than squashing the data to the bottom.
            ax.plot([], [], color=colour, linestyle=":", linewidth=1.3, label=f"{text} (off scale)")
            continue
        ax.axhline(value, color=colour, linestyle="--", linewidth=1.3, label=text, zorder=4)
        drawn += 1

    if not series:
        note = "no data in this window" if not always_off else "never active in this window"
        ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", color="grey")

    when = datetime.fromtimestamp(start, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    ax.set_title(title, fontsize=12, fontweight="bold", loc="left")
    ax.set_xlabel(f"time since {when} ({'min' if minutes else 's'})")
    ax.set_ylabel(unit.label)
    ax.set_xlim(0, span / xscale)
    bottom = None if y_min is None else y_min * unit.factor
    top = None if y_max is None else y_max * unit.factor
    if bottom is not None or top is not None:
        ax.set_ylim(bottom=bottom, top=top)
    if top is None and stages:  # headroom so the stage names never sit on the data
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi + (hi - lo) * 0.08)
    ax.grid(True, color="#dddddd", linewidth=0.6, zorder=1)
    ax.set_axisbelow(True)
    handles, labels = ax.get_legend_handles_labels()
    if stacked and shown:  # list the stack top-down, as it reads
        n = len(shown)
        handles = handles[:n][::-1] + handles[n:]
        labels = labels[:n][::-1] + labels[n:]
    for label, colour in alert_legend(alerts, start, end):
        handles.append(Patch(facecolor=colour, alpha=0.6, linewidth=0))
        labels.append(label)
    if handles:
        ax.legend(
            handles,
            labels,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=8,
            ncol=1 if len(handles) <= 12 else 2,
            frameon=False,
            title=_legend_title(hidden, always_off, boolean),
            title_fontsize=7,
        )
    fig.tight_layout()
    return fig


def alert_legend(alerts: Sequence[FiredAlert], start: float, end: float) -> list[tuple[str, str]]:
    """One legend entry per alert name that fired inside ``start``–``end``: (``alert NAME (severity)``, colour)."""
    seen: dict[str, str] = {}
    for alert in alerts:
        if min(alert.end, end) > max(alert.start, start) and alert.name not in seen:
            seen[alert.name] = alert.severity
    return [(f"alert {name}" + (f" ({sev})" if sev else ""), alert_colour(sev)) for name, sev in seen.items()]


def _legend_title(hidden: int, always_off: int, boolean: bool) -> str | None:
    notes = []
    if hidden:
        notes.append(f"+{hidden} smaller series not shown")
    if always_off:
        notes.append(f"{always_off} {'never-active states' if boolean else 'series at 0 throughout'} not shown")
    return "\n".join(notes) or None


def _fmt(value: float) -> str:
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 1:
        return f"{value:.3g}"
    return f"{value:.2g}"


def xy_chart(
    title: str,
    x_label: str,
    y_label: str,
    points: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    *,
    curve: Sequence[tuple[float, float]] = (),
    curve_label: str = "",
    optimum: tuple[float, float] | None = None,
    log_x: bool = False,
    dpi: int = 100,
) -> bytes:
    """One PNG of measured points against a swept parameter (an experiment's table), optionally with a fitted
    curve and its optimum: the batching-window U-curve, a burst or search curve."""
    fig = Figure(figsize=(9.6, 4.4), dpi=dpi)
    ax = fig.add_subplot()
    ax.set_prop_cycle(color=list(_DATA_COLOURS))
    for name, pts in points:
        ordered = sorted(pts)
        ax.plot([p[0] for p in ordered], [p[1] for p in ordered], "o-", label=name, linewidth=0.8, zorder=3)
    if curve:
        ax.plot([c[0] for c in curve], [c[1] for c in curve], "-", color=_REF_COLOURS[0], label=curve_label, zorder=4)
    if optimum is not None:
        ax.plot([optimum[0]], [optimum[1]], "x", color=_REF_COLOURS[1], markersize=11, mew=2.2, zorder=5,
                label=f"fitted optimum {_fmt(optimum[0])} → {_fmt(optimum[1])}")  # fmt: skip
    if log_x:
        ax.set_xscale("log")
    ax.set_title(title, fontsize=12, fontweight="bold", loc="left")
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.grid(True, color="#dddddd", linewidth=0.6, zorder=1)
    ax.set_axisbelow(True)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
