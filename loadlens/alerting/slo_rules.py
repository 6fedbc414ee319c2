"""The SLO rules: per-class SLIs (sloth's series names), the serving layer's recording rules, the latency
and ratio alerts and the multi-window burn-rate alerts."""

from __future__ import annotations

from typing import Any

from loadlens.alerting.rule_kit import BURN_WINDOWS, SERVICE, SLI_WINDOWS, Ctx, alert, le
from loadlens.contracts.slo import PriorityClass


def _ttft_sli(c: Ctx, cls: PriorityClass, window: str) -> str:
    s = c.sel("serving", f'priority_class="{cls.name}"')
    good = c.sel("serving", f'priority_class="{cls.name}",le="{le(cls.ttft_seconds)}"')
    return (
        f"1 - (sum by (gen_ai_request_model) (rate(gen_ai_server_time_to_first_token_seconds_bucket{good}[{window}]))"
        f" / sum by (gen_ai_request_model) (rate(gen_ai_server_time_to_first_token_seconds_count{s}[{window}])))"
    )


def _error_sli(c: Ctx, window: str) -> str:
    s = c.sel("serving")
    bad = c.sel("serving", 'code=~"5..|429"')
    return (
        f"sum by (model_name) (rate(loadlens_requests_total{bad}[{window}]))"
        f" / sum by (model_name) (rate(loadlens_requests_total{s}[{window}]))"
    )


def slo_recording_groups(c: Ctx) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for cls in c.slos.classes:
        slo = f"ttft-{cls.name}"
        labels = {"sloth_service": SERVICE, "sloth_slo": slo, "sloth_id": f"{SERVICE}-{slo}"}
        rules: list[dict[str, Any]] = [
            {
                "record": f"slo:sli_error:ratio_rate{w}",
                "expr": _ttft_sli(c, cls, w),
                "labels": {**labels, "sloth_window": w},
            }
            for w in SLI_WINDOWS
        ]
        rules += [
            {"record": "slo:objective:ratio", "expr": f"vector({cls.objective_ratio})", "labels": labels},
            {"record": "slo:error_budget:ratio", "expr": f"vector({1 - cls.objective_ratio:.6g})", "labels": labels},
        ]
        groups.append({"name": f"loadlens-slo-{slo}", "rules": rules})
    labels = {"sloth_service": SERVICE, "sloth_slo": "availability", "sloth_id": f"{SERVICE}-availability"}
    objective = c.slos.availability_objective_ratio
    rules = [
        {"record": f"slo:sli_error:ratio_rate{w}", "expr": _error_sli(c, w), "labels": {**labels, "sloth_window": w}}
        for w in SLI_WINDOWS
    ]
    rules += [
        {"record": "slo:objective:ratio", "expr": f"vector({objective})", "labels": labels},
        {"record": "slo:error_budget:ratio", "expr": f"vector({1 - objective:.6g})", "labels": labels},
    ]
    groups.append({"name": "loadlens-slo-availability", "rules": rules})
    return groups


def serving_recording_group(c: Ctx) -> dict[str, Any]:
    w = c.a["latency_window"]
    s = c.sel("serving")
    by = "gen_ai_request_model, priority_class"
    rules = [
        {
            "record": f"gen_ai_request_model_priority_class:gen_ai_server_time_to_first_token_seconds:p99_rate{w}",
            "expr": f"histogram_quantile(0.99, sum by (le, {by}) "
            f"(rate(gen_ai_server_time_to_first_token_seconds_bucket{s}[{w}])))",
        },
        {
            "record": f"model_name_priority_class:loadlens_inter_token_latency_seconds:p99_rate{w}",
            "expr": "histogram_quantile(0.99, sum by (le, model_name, priority_class) "
            f"(rate(loadlens_inter_token_latency_seconds_bucket{s}[{w}])))",
        },
        {
            "record": f"gen_ai_request_model_priority_class:gen_ai_server_request:rate{w}",
            "expr": f"sum by ({by}) (rate(gen_ai_server_time_to_first_token_seconds_count{s}[{w}]))",
        },
        {
            "record": "model_name:loadlens_requests:rate5m",
            "expr": f"sum by (model_name) (rate(loadlens_requests_total{s}[5m]))",
        },
        {
            "record": "model_name:loadlens_requests_errors:ratio_rate5m",
            "expr": _error_sli(c, "5m"),
        },
        {
            "record": "model_name_priority_class:loadlens_goodput:ratio_rate5m",
            "expr": f"sum by (model_name, priority_class) (rate(loadlens_goodput_requests_total{s}[5m]))"
            f" / sum by (model_name, priority_class) (rate(loadlens_slo_eligible_requests_total{s}[5m]))",
        },
        {
            "record": "model_name:loadlens_lora_swap_delayed:ratio_rate5m",
            "expr": f"sum by (model_name) (rate(loadlens_lora_swap_delayed_requests_total{s}[5m]))"
            f" / sum by (model_name) (rate(loadlens_slo_eligible_requests_total{s}[5m]))",
        },
    ]
    return {"name": "loadlens-serving-recording", "rules": rules}


# --- alerts -------------------------------------------------------------------------------------------


def slo_alert_group(c: Ctx) -> dict[str, Any]:
    a = c.a
    w = a["latency_window"]
    rules: list[dict[str, Any]] = []
    min_rate = a["min_request_rate"]
    for cls in c.slos.classes:
        in_class = c.sel("serving", f'priority_class="{cls.name}"')
        traffic = (
            f'gen_ai_request_model_priority_class:gen_ai_server_request:rate{w}{{priority_class="{cls.name}"}}'
            f" > {min_rate}"
        )
        rules.append(
            alert(
                "LoadlensTTFTP99High",
                f"gen_ai_request_model_priority_class:gen_ai_server_time_to_first_token_seconds:p99_rate{w}"
                f'{{priority_class="{cls.name}"}} > {cls.ttft_seconds} and on (gen_ai_request_model, priority_class) '
                f"({traffic})",
                a["latency_for"],
                "critical",
                "Time to first token p99 is over its SLO.",
                f"TTFT p99 of {{{{ $labels.gen_ai_request_model }}}} ({cls.name}) is "
                f"{{{{ $value | humanizeDuration }}}} over {w}, above the {cls.ttft_seconds:g} s SLO.",
                slo="ttft",
                priority_class=cls.name,
            )
        )
        rules.append(
            alert(
                "LoadlensITLP99High",
                f"model_name_priority_class:loadlens_inter_token_latency_seconds:p99_rate{w}"
                f'{{priority_class="{cls.name}"}} > {cls.itl_seconds} and on (model_name, priority_class) '
                f"(sum by (model_name, priority_class) (rate(loadlens_slo_eligible_requests_total{in_class}[{w}]))"
                f" > {min_rate})",
                a["latency_for"],
                "critical",
                "Inter-token latency p99 is over its SLO.",
                f"ITL p99 of {{{{ $labels.model_name }}}} ({cls.name}) is {{{{ $value | humanizeDuration }}}} "
                f"over {w}, above the {cls.itl_seconds:g} s SLO.",
                slo="itl",
                priority_class=cls.name,
            )
        )
    s = c.sel("serving")
    rules.append(
        alert(
            "LoadlensErrorRatioHigh",
            f"model_name:loadlens_requests_errors:ratio_rate5m > {a['error_ratio']}"
            f" and on (model_name) model_name:loadlens_requests:rate5m > {min_rate}",
            "2m",
            "critical",
            "Too many requests fail with a server error or are rejected.",
            "{{ $value | humanizePercentage }} of requests to {{ $labels.model_name }} failed (5xx) or were "
            f"rejected (429) over 5m; the threshold is {a['error_ratio']:.0%}.",
            slo="availability",
        )
    )
    rules.append(
        alert(
            "LoadlensGoodputLow",
            f"model_name_priority_class:loadlens_goodput:ratio_rate5m < {a['goodput_ratio_min']}"
            f" and on (model_name, priority_class) sum by (model_name, priority_class)"
            f" (rate(loadlens_slo_eligible_requests_total{s}[5m])) > {min_rate}",
            "2m",
            "warning",
            "Too few requests meet all of their SLOs (goodput dropped).",
            "Only {{ $value | humanizePercentage }} of {{ $labels.priority_class }} requests to "
            "{{ $labels.model_name }} met every SLO over 5m; the floor is "
            f"{a['goodput_ratio_min']:.0%}.",
            slo="goodput",
        )
    )
    swap = c.slos.lora_swap
    rules.append(
        alert(
            "LoadlensLoraSwapSLABreached",
            f"model_name:loadlens_lora_swap_delayed:ratio_rate5m > {swap.max_delayed_ratio}",
            "2m",
            "critical",
            "Too many requests are delayed by LoRA adapter hot swaps.",
            "{{ $value | humanizePercentage }} of requests to {{ $labels.model_name }} waited more than "
            f"{swap.delay_seconds * 1000:g} ms behind adapter loads over 5m; the SLA allows "
            f"{swap.max_delayed_ratio:.1%}.",
            slo="lora_swap",
        )
    )
    return {"name": "loadlens-slo-alerts", "rules": rules}


def burn_rate_group(c: Ctx) -> dict[str, Any]:
    rules = []
    slos = [
        (f"ttft-{cls.name}", "LoadlensTTFTErrorBudgetBurn", "time to first token", 1 - cls.objective_ratio)
        for cls in c.slos.classes
    ]
    slos.append(("availability", "LoadlensErrorBudgetBurn", "availability", 1 - c.slos.availability_objective_ratio))
    for slo, alertname, what, budget in slos:
        sid = f'sloth_id="{SERVICE}-{slo}", sloth_service="{SERVICE}", sloth_slo="{slo}"'
        for severity in ("critical", "warning"):
            rows = [r for r in BURN_WINDOWS if r[0] == severity]
            parts = []
            for _, long_w, short_w, factor, _ in rows:
                limit = f"{factor * budget:.6g}"  # factor x error budget, as sloth writes it
                parts.append(
                    f"(max(slo:sli_error:ratio_rate{long_w}{{{sid}}} > {limit}) without (sloth_window)"
                    f" and max(slo:sli_error:ratio_rate{short_w}{{{sid}}} > {limit}) without (sloth_window))"
                )
            windows = " or ".join(f"{r[1]}/{r[2]} at {r[3]:g}x" for r in rows)
            rules.append(
                alert(
                    alertname,
                    "\nor ".join(parts),
                    rows[0][4],
                    severity,
                    f"The {what} SLO is burning its error budget too fast.",
                    f"{{{{ $labels.sloth_slo }}}} error ratio is {{{{ $value | humanizePercentage }}}} over both "
                    f"windows of one of: {windows} the budget rate (30-day budget {budget:.3g}).",
                    slo=slo,
                    sloth_severity="page" if severity == "critical" else "ticket",
                )
            )
    return {"name": "loadlens-slo-burn-rate", "rules": rules}
