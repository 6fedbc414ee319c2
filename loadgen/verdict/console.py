"""The verdict for the console: its headline, the failed checks, the alerts and pages of the window.

Usage::

    print(verdict_text(verdict))
"""

from __future__ import annotations

from loadlens.contracts.results import Verdict


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    return f"{x:.1f} ms" if unit == "ms" else f"{x * 100:.2f} %"


def verdict_text(verdict: Verdict) -> str:
    """The verdict for the console: the headline, failed checks, alerts and pages of the window."""
    lines = [f"verdict: {verdict.headline}"]
    failed = [c for c in verdict.slos if c.passed is False]
    judged = sum(1 for c in verdict.slos if c.passed is not None)
    stages = ", ".join(f"{name} {status.upper()}" for name, status in verdict.stages.items())
    lines.append(f"  stages: {stages}")
    lines.append(f"  SLO checks: {judged - len(failed)} of {judged} passed" + (", failed:" if failed else ""))
    for c in failed:
        cls = c.priority_class or "all"
        lines.append(
            f"    {c.stage:<14} {cls:<12} {c.slo:<11} {c.statistic:<5} {_fmt(c.observed, c.unit):>11} "
            f"(SLO {c.comparison} {_fmt(c.threshold, c.unit)})"
        )
    w = verdict.window
    if verdict.alerts_source is None:
        lines.append("  alerts: not checked (no --prometheus)")
    else:
        waited = f"waited {w.waited_seconds or 0:.0f} s of at most {w.wait_limit_seconds or 0:.0f} s"
        lines.append(f"  alerts of the run {w.start} .. {w.end} (checked until {w.checked_until}, {waited}):")
        if not verdict.alerts:
            lines[-1] += " none"
        if w.unsettled:
            lines.append(f"    (the wait ended still waiting for: {', '.join(w.unsettled)})")
        for a in verdict.alerts:
            # sloth_* labels name the burn-rate rule's origin; the file keeps them, the console leaves them out
            labels = " ".join(f"{k}={v}" for k, v in a.labels.items() if not k.startswith("sloth_"))
            until = f" until {a.ends_at}" if a.ends_at else ""
            lines.append(
                f"    {a.severity or '-':<8} {a.alertname:<34} {a.state:<8} since {a.starts_at}{until}  {labels}"
            )
    if verdict.pages_source is None:
        lines.append("  pages: not checked (no --pager)")
    else:
        lines.append(f"  pages the pager received for alerts of the run: {len(verdict.pages) or 'none'}")
        for p in verdict.pages:
            lines.append(f"    {p.at} {p.receiver:<7} {p.status:<8} {p.severity or '-':<8} {p.alertname}")
    for e in verdict.errors:
        lines.append(f"  error: {e}")
    return "\n".join(lines)
