"""``loadlens report``: the dashboards' queries over a test window, as one self-contained HTML page."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from loadlens.report.documents import write_page
from loadlens.util.cliutil import UsageError, env_arg

if TYPE_CHECKING:
    from loadlens.contracts.slo import SLOConfig
    from loadlens.dashboards.model import Dashboard
    from loadlens.report.html import ChartSection
    from loadlens.report.queries import FiredAlert, PanelData, Stage
    from loadlens.report.results import Results
    from loadlens.util.prometheus import PrometheusClient

ENV = "LOADLENS_REPORT_"
DEFAULT_PROMETHEUS = "http://127.0.0.1:19090"  # the local stack's Prometheus (loadlens/contracts/ports.py)
REPORT_FILE = "index.html"
REPORT_DIR = "report"  # the default --out: beside the results, <run dir>/report/


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="render the dashboards' queries for a test window into a self-contained HTML report",
        description=(
            "A post-mortem of one test window as one offline HTML file: the run's verdict, the alerts that fired "
            "(Prometheus ALERTS), the per-stage table, then the dashboards' panels grouped by question, drawn over "
            "--from/--to with stage bands, firing alerts and SLO lines. Times are Unix seconds or ISO 8601; with "
            "--results they default to the run's start and end, and the page goes to <run dir>/report/index.html."
        ),
    )
    env_arg(p, "--prometheus", default=DEFAULT_PROMETHEUS, help="Prometheus base URL", env_prefix=ENV)
    env_arg(p, "--from", dest="start", metavar="T", help="window start (Unix seconds or ISO 8601)", env_prefix=ENV)
    env_arg(p, "--to", dest="end", metavar="T", help="window end (Unix seconds or ISO 8601)", env_prefix=ENV)
    env_arg(
        p,
        "--results",
        type=Path,
        metavar="PATH",
        help="the run's directory or its benchmark_result.json, an experiment's directory or its "
        "experiment_result.json, or a loadlens gpu-bench directory or its gpu_bench.json",
        env_prefix=ENV,
    )
    env_arg(
        p,
        "--out",
        type=Path,
        metavar="DIR",
        help="output directory, the page is DIR/index.html (default: report/ beside the results file)",
        env_prefix=ENV,
    )
    env_arg(
        p,
        "--rate-interval",
        default="30s",
        help="window substituted for Grafana's $__rate_interval",
        env_prefix=ENV,
    )
    env_arg(p, "--slo-file", type=Path, metavar="PATH", help="SLO file (default: the packaged one)", env_prefix=ENV)
    p.set_defaults(handler=run)


def _window(args: argparse.Namespace, results_start: float | None, results_end: float | None) -> tuple[float, float]:
    from loadlens.report.queries import parse_time

    def one(flag: str, text: str | None, fallback: float | None) -> float:
        if text is None or text == "":
            if fallback is None:
                raise UsageError(f"{flag} is required (or give --results with a run start and end)")
            return fallback
        try:
            return parse_time(text)
        except ValueError as err:
            raise UsageError(f"{flag}: {err}") from None

    start = one("--from", args.start, results_start)
    end = one("--to", args.end, results_end)
    if end <= start:
        raise UsageError(f"--to ({end:.3f}) must be after --from ({start:.3f})")
    return start, end


def _query_options(args: argparse.Namespace) -> str:
    """``--rate-interval`` parsed and ``--prometheus`` checked, before anything is queried."""
    from loadlens.report.queries import parse_duration

    try:
        rate_interval = parse_duration(args.rate_interval)
    except ValueError as err:
        raise UsageError(f"--rate-interval: {err}") from None
    if not str(args.prometheus).startswith(("http://", "https://")):
        raise UsageError(f"--prometheus: not an http(s) URL: {args.prometheus!r}")
    return rate_interval


def out_dir(out: Path | None, results: Results | None) -> Path:
    """Where the page goes: ``--out``, else ``report/`` beside the results file; without either, a usage
    error (the report never lands in whatever directory the command ran from)."""
    if out is None:
        if results is None:
            raise UsageError("--out is required without --results (by default the report goes beside the results)")
        out = Path(results.source).parent / REPORT_DIR
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {out} exists and is not a directory")
    return out


def run(args: argparse.Namespace) -> int:
    from loadlens.contracts.results import ResultsError
    from loadlens.contracts.slo import SLOConfigError, load_slos
    from loadlens.dashboards.catalog import dashboards
    from loadlens.report.engines import engine_dialects, report_boards
    from loadlens.report.results import load_results
    from loadlens.util.prometheus import PrometheusClient, PrometheusUnreachable

    results: Results | None = None
    if args.results is not None:
        from loadlens.report.experiment import experiment_file
        from loadlens.report.gpu_bench import gpu_bench_file

        bench = gpu_bench_file(args.results)
        if bench is not None:
            return gpu_bench_report(args, bench)

        experiment = experiment_file(args.results)
        if experiment is not None:
            return experiment_report(args, experiment)
        try:
            results = load_results(args.results)
        except ResultsError as err:
            raise UsageError(str(err)) from None
    start, end = _window(args, results.start if results else None, results.end if results else None)
    rate_interval = _query_options(args)
    out = out_dir(args.out, results)
    try:
        slos = load_slos(args.slo_file)
        every_board = dashboards(args.slo_file)
    except SLOConfigError as err:
        raise UsageError(str(err)) from None
    client = PrometheusClient(args.prometheus)
    try:
        client.check()
    except PrometheusUnreachable as err:
        print(f"loadlens report: error: {err}", file=sys.stderr)
        return 1
    try:
        boards = report_boards(every_board, engine_dialects(client, start, end))
        path = build_report(client, boards, slos, start, end, results, out, rate_interval)
    except PrometheusUnreachable as err:
        print(f"loadlens report: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"loadlens report: error: cannot write {out}: {err.strerror}", file=sys.stderr)
        return 1
    print(f"loadlens report: {path}")
    return 0


def chart_sections(
    panels: Sequence[PanelData],
    slos: SLOConfig,
    start: float,
    end: float,
    stages: Sequence[Stage] = (),
    alerts: Sequence[FiredAlert] = (),
) -> list[ChartSection]:
    """The question sections: panels flat at 0 or without data are named in one line each, the rest drawn
    with the stage bands, the firing alerts and their reference lines."""
    from loadlens.report.charts import render
    from loadlens.report.html import Chart, ChartSection
    from loadlens.report.queries import reference_lines
    from loadlens.report.sections import flat_zero, no_data, order_panels, slo_for, slug

    sections: list[ChartSection] = []
    used: set[str] = set()
    for question, members in order_panels(panels):
        charts: list[Chart] = []
        flat: list[str] = []
        empty: list[str] = []
        for data in members:
            panel = data.panel
            if no_data(data):
                empty.append(panel.title)
                continue
            if flat_zero(data):
                flat.append(panel.title)
                continue
            png = render(
                panel.title,
                panel.unit,
                data.series,
                start=start,
                end=end,
                stages=stages,
                alerts=alerts,
                ref_lines=reference_lines(panel, slos, slo_for(question, panel.title)),
                stacked=panel.stack,
                y_min=panel.min,
                y_max=panel.max,
            )
            anchor = base = f"chart-{slug(panel.title)}"
            n = 1
            while anchor in used:
                n += 1
                anchor = f"{base}-{n}"
            used.add(anchor)
            charts.append(
                Chart(anchor, data.dashboard, data.row, panel.title, panel.description, png, tuple(data.errors))
            )
        sections.append(
            ChartSection(question.anchor, question.title, question.intro, tuple(charts), tuple(flat), tuple(empty))
        )
    return sections


def build_report(
    client: PrometheusClient,
    boards: Mapping[str, Dashboard],
    slos: SLOConfig,
    start: float,
    end: float,
    results: Results | None,
    out: Path,
    rate_interval: str = "30s",
) -> Path:
    """Query, draw, write ``out/index.html`` (atomically); returns its path."""
    from loadlens.report.html import render_page
    from loadlens.report.queries import collect, collect_alerts
    from loadlens.util.prometheus import QueryError

    panels, prom_stages = collect(client, boards, start, end, rate_interval)
    stages = list(results.stages) if results is not None and results.stages else prom_stages
    # Alerts with a `for:` fire after the load that caused them: look as far as the load generator's verdict did.
    verdict = results.verdict if results is not None else None
    checked = verdict.checked_until_timestamp if verdict is not None else None
    alerts_end = max(end, checked) if checked is not None else end
    alert_error: str | None = None
    try:
        alerts = collect_alerts(client, start, alerts_end)
    except QueryError as err:
        alerts, alert_error = [], str(err)
    page = render_page(
        prometheus=client.url,
        start=start,
        end=end,
        sections=chart_sections(panels, slos, start, end, stages, alerts),
        results=results,
        rate_interval=rate_interval,
        generated=time.time(),
        alerts=alerts,
        alert_error=alert_error,
        alerts_end=alerts_end,
    )
    return write_page(out, REPORT_FILE, page)


def gpu_bench_report(args: argparse.Namespace, file: Path) -> int:
    """``--results`` names a ``loadlens gpu-bench`` result: its tables as one page, without Prometheus."""
    from loadlens.contracts.gpu_bench_result import GpuBenchError
    from loadlens.report.gpu_bench import load_gpu_bench, render_gpu_bench_page

    try:
        result = load_gpu_bench(file)
    except GpuBenchError as err:
        raise UsageError(str(err)) from None
    out = args.out if args.out is not None else file.parent / REPORT_DIR
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {out} exists and is not a directory")
    page = render_gpu_bench_page(result, source=str(file), generated=time.time())
    try:
        path = write_page(out, REPORT_FILE, page)
    except OSError as err:
        print(f"loadlens report: error: cannot write {out}: {err.strerror}", file=sys.stderr)
        return 1
    print(f"loadlens report: {path}")
    return 0


def experiment_report(args: argparse.Namespace, file: Path) -> int:
    """``--results`` names an experiment: its findings, tables, fits, plots and per-run verdicts, then (when
    Prometheus answers) the alerts and charts over the experiment's window with a band per run. Prometheus
    is optional here: unreachable, the page says so and is written without charts."""
    from loadlens.contracts.experiment_result import ExperimentResultError
    from loadlens.contracts.slo import SLOConfigError, load_slos
    from loadlens.dashboards.catalog import dashboards
    from loadlens.report.engines import engine_dialects, report_boards
    from loadlens.report.experiment import load_experiment, render_experiment_page, run_bands, window
    from loadlens.report.queries import collect, collect_alerts
    from loadlens.util.prometheus import PrometheusClient, PrometheusUnreachable, QueryError

    try:
        result = load_experiment(file)
    except ExperimentResultError as err:
        raise UsageError(str(err)) from None
    first, last = window(result)
    span = _window(args, first, last) if first is not None or args.start else None
    rate_interval = _query_options(args)
    out = args.out if args.out is not None else file.parent / REPORT_DIR
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {out} exists and is not a directory")
    try:
        slos = load_slos(args.slo_file)
        every_board = dashboards(args.slo_file)
    except SLOConfigError as err:
        raise UsageError(str(err)) from None
    start, end = span if span is not None else (None, None)
    note: str | None = None
    kwargs: dict[str, object] = {}
    if span is None:
        note = "Charts not drawn: the experiment has no finished run, so no window (give --from and --to)."
    else:
        assert start is not None and end is not None
        client = PrometheusClient(args.prometheus)
        try:
            client.check()
            boards = report_boards(every_board, engine_dialects(client, start, end))
            panels, _ = collect(client, boards, start, end, rate_interval)
            alert_error: str | None = None
            try:
                alerts = collect_alerts(client, start, end)
            except QueryError as err:
                alerts, alert_error = [], str(err)
            sections = chart_sections(panels, slos, start, end, run_bands(result), alerts)
            kwargs = {"prometheus": client.url, "sections": sections, "alerts": alerts, "alert_error": alert_error}
        except PrometheusUnreachable as err:
            note = f"Charts not drawn: {err}."
            print(f"loadlens report: warning: {err}; writing the experiment without charts", file=sys.stderr)
    page = render_experiment_page(
        result,
        source=str(file),
        generated=time.time(),
        start=start,
        end=end,
        chart_note=note,
        **kwargs,  # type: ignore[arg-type]
    )
    try:
        path = write_page(out, REPORT_FILE, page)
    except OSError as err:
        print(f"loadlens report: error: cannot write {out}: {err.strerror}", file=sys.stderr)
        return 1
    print(f"loadlens report: {path}")
    return 0
