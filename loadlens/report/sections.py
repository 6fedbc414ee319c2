"""How the report reads like a post-mortem: the page's sections in order, and the dashboard panels each
question section draws.

The charts are the dashboards' own panels (``loadlens/dashboards/``), regrouped by the question an SRE asks
after a run instead of by dashboard. A panel no question claims lands in "Other charts", so a new dashboard
panel is never silently dropped (tests/report checks that today none does).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from loadlens.report.queries import PanelData


@dataclass(frozen=True)
class Question:
    """One chart section: its anchor, heading, what it answers, and the panel titles it draws, in order."""

    anchor: str
    title: str
    intro: str
    panels: tuple[str, ...]
    # Latency panels without their own SLO series that get an SLO's lines anyway (queue and prefill are parts
    # of TTFT; decode is part of E2E): panel title -> slo name in the SLO file.
    slo_lines: tuple[tuple[str, str], ...] = ()


QUESTIONS: tuple[Question, ...] = (
    Question(
        "load",
        "What load did the test apply?",
        "Users and request rate per stage, and the tokens the server produced under them.",
        ("Users", "Requests per second", "Requests by priority class", "Output tokens per second"),
    ),
    Question(
        "slo",
        "Did we meet the SLO?",
        "Server-side latency percentiles against each priority class's SLO (dashed), goodput and breaches.",
        (
            "TTFT (server)",
            "ITL (server)",
            "E2E latency (server)",
            "TTFT p99 by priority class",
            "Goodput",
            "Goodput ratio",
            "SLA breaches",
            "Fairness (Jain's index)",
        ),
    ),
    Question(
        "latency",
        "Where did latency come from?",
        "Client against server, the request's phases in the engine, batch size, LoRA swaps.",
        (
            "TTFT: client vs server",
            "Queue time",
            "Prefill time",
            "Decode time",
            "Batch size (iteration tokens)",
            "LoRA adapters in use",
            "Swap blocking",
            "Requests delayed by swaps",
        ),
        slo_lines=(("Queue time", "ttft"), ("Prefill time", "ttft"), ("Decode time", "e2e")),
    ),
    Question(
        "engine",
        "Did the engine queue, preempt or reject?",
        "The scheduler's queue, KV cache pressure, preemptions, and requests refused or aborted.",
        (
            "Running / waiting",
            "KV cache usage",
            "Preemptions",
            "Rejected requests",
            "Aborted requests",
            "Errors by reason",
        ),
    ),
    Question(
        "gpu",
        "Was the GPU the bottleneck?",
        "Utilisation and its swing, SM and tensor activity, estimated MFU and MBU, power, temperature, clocks and "
        "what held them down, XID errors.",
        (
            "GPU utilisation",
            "Utilisation swing (p95 − p5)",
            "Utilisation swing period",
            "SM and tensor activity (GPM)",
            "MFU / MBU (estimated)",
            "Power",
            "Temperature",
            "Clocks",
            "Throttle reasons",
            "XID errors",
        ),
    ),
    Question(
        "vram",
        "Did VRAM and the allocator hold up?",
        "Device memory from NVML, who owns it, and the caching allocator's view.",
        (
            "VRAM used / reserved / total",
            "VRAM by owner",
            "VRAM by process",
            "VRAM fluctuation",
            "VRAM step increases",
            "Allocator fragmentation",
            "Allocator memory",
        ),
    ),
    Question(
        "rig",
        "Could the test rig keep up?",
        "Whether the simulated engine kept real time (its latencies include its own lag).",
        ("Sim lag behind real time", "Late steps and schedule restarts"),
    ),
)
OTHER = Question("other", "Other charts", "Dashboard panels no question above draws.", ())

# The page's sections, in order (the anchors the table of contents links to). Chart sections follow the
# alerts and the per-stage table.
VERDICT, ALERTS, STAGES = "verdict", "alerts", "stages"
SECTION_TITLES: dict[str, str] = {
    VERDICT: "Verdict",
    ALERTS: "Alerts that fired",
    STAGES: "Per stage",
    **{q.anchor: q.title for q in QUESTIONS},
    OTHER.anchor: OTHER.title,
}


def question_of(title: str) -> Question:
    for question in QUESTIONS:
        if title in question.panels:
            return question
    return OTHER


def slo_for(question: Question, title: str) -> str | None:
    return dict(question.slo_lines).get(title)


def flat_zero(data: PanelData) -> bool:
    """Every series is 0 at every point (a counter that never moved, a state never on), and no query failed."""
    return bool(data.series) and not data.errors and all(v == 0 for s in data.series for v in s.values)


def no_data(data: PanelData) -> bool:
    """No query returned a series in the window (the metric does not exist here), and no query failed."""
    return not data.series and not data.errors


_SLUG = re.compile(r"[^a-z0-9]+")


def slug(text: str) -> str:
    """An HTML id: lower case ASCII letters and digits joined by ``-`` (``TTFT (server)`` -> ``ttft-server``)."""
    return _SLUG.sub("-", text.lower()).strip("-") or "x"


def order_panels(panels: Sequence[PanelData]) -> list[tuple[Question, list[PanelData]]]:
    """The panels grouped by question, in the questions' order and each question's panel order; "Other
    charts" last, in dashboard order. Questions without a panel are left out."""
    grouped: dict[str, list[PanelData]] = {}
    for data in panels:
        grouped.setdefault(question_of(data.panel.title).anchor, []).append(data)
    out: list[tuple[Question, list[PanelData]]] = []
    for question in (*QUESTIONS, OTHER):
        members = grouped.get(question.anchor, [])
        if not members:
            continue
        rank = {title: i for i, title in enumerate(question.panels)}
        members.sort(key=lambda d: rank.get(d.panel.title, len(rank)))
        out.append((question, members))
    return out
