"""The serving dashboard's two metric dialects, proven on recorded expositions in a real Prometheus.

tests/fixtures/sglang/ holds one modelled workload as sglang and as vLLM expose it (engine_expositions.py).
Both are loaded into one Prometheus (``promtool tsdb create-blocks-from openmetrics``, then Prometheus on
those blocks), with the ``job`` and ``instance`` labels a scrape of an upstream under the stack's serving
job gives them. Then every engine query of each view (``loadlens-serving``: vllm:, ``loadlens-serving-sglang``:
sglang:) runs as a range query over the recording, and the exact set that stays empty is asserted with
its reason. The sglang view's other queries read loadlens's own series: each must be a query of the vLLM
view too, which tests/dashboards/test_live_data.py proves on a live sim run. The panels the sglang view
leaves out are asserted by title, each with the mapping's reason. Where both views chart the same gauge or
counter (running, waiting, KV usage, preemptions, engine aborts) their values must be equal at every step:
the same requests, read through the mapping.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import pytest

from loadlens.contracts.engine_series import ENGINE_SERIES
from loadlens.contracts.ports import SERVE_JOB
from loadlens.contracts.slo import load_slos
from loadlens.dashboards import serving
from loadlens.dashboards.catalog import dashboards
from loadlens.dashboards.model import Dashboard
from tests.dashboards import engine_expositions as rec
from tests.dashboards.support import all_queries
from tests.support.paths import ROOT
from tests.support.prometheus import PrometheusServer, prometheus_on_openmetrics

VIEWS = {"vllm": "loadlens-serving", "sglang": "loadlens-serving-sglang"}
FIXTURE = {"vllm": rec.VLLM_FILE, "sglang": rec.SGLANG_FILE}
# As the compose stack names the upstream it scrapes into the serving job (deploy/compose/prometheus.yml).
INSTANCE = {"vllm": "vllm:8001", "sglang": "sglang:8001"}
PREFIX = {"vllm": "vllm:", "sglang": "sglang:"}
# From the first full $__rate_interval (1m at the fixture's 15 s scrapes) to the last scrape.
START = rec.START + 60
END = rec.START + rec.DURATION
STEP = 15
RATE_WINDOW = 60
VARIABLES = {"$__rate_interval": f"{RATE_WINDOW}s", "$model": rec.MODEL, "$instance": ".*", "$stage": ".*"}

_NO_LORA = "the recorded vLLM runs without --enable-lora, so vllm:lora_requests_info is not exported"
# Engine queries that stay empty on the recording, by "<view> / <panel> / <legend>", and why.
EXPECTED_EMPTY: dict[str, str] = {
    "loadlens-serving / LoRA adapters in use / adapters running": _NO_LORA,
    "loadlens-serving / LoRA adapters in use / adapters waiting": _NO_LORA,
}
_SIM = "sim engine only: the simulator speaks vLLM's dialect and is never an sglang upstream"
# Panels of the vLLM view that the sglang view leaves out, and why.
LEFT_OUT_OF_SGLANG: dict[str, str] = {
    "Batch size (iteration tokens)": "no sglang counterpart of vllm:iteration_tokens_total",
    "Decode time": "no sglang counterpart of vllm:request_decode_time_seconds",
    "Sim lag behind real time": _SIM,
    "Late steps and schedule restarts": _SIM,
}
# Targets both views draw from the same gauge or counter: equal values at every step.
SAME_VALUES = (
    ("Running / waiting", "running"),
    ("Running / waiting", "waiting"),
    ("KV cache usage", "KV cache used"),
    ("Preemptions", "preemptions/s"),
    ("Aborted requests", "engine {{finished_reason}}"),
)


def _concrete(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


def _board(stem: str) -> Dashboard:
    return dashboards()[stem]


def _targets(stem: str) -> dict[tuple[str, str], str]:
    return {(p.title, t.legend): t.expr for p in _board(stem).panels() for t in p.targets}


def with_target_labels(text: str, job: str, instance: str) -> str:
    """The exposition as Prometheus stores it after a scrape: ``job`` and ``instance`` on every sample."""
    labels = f'job="{job}",instance="{instance}"'
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            out.append(line)
        elif "{" in line:
            name, rest = line.split("{", 1)
            out.append(f"{name}{{{labels},{rest}")
        else:
            name, rest = line.split(" ", 1)
            out.append(f"{name}{{{labels}}} {rest}")
    return "\n".join(out) + "\n"


# --- without a Prometheus -------------------------------------------------------------------------------


def test_recorded_expositions_are_current() -> None:
    """The committed fixtures are what the generator writes (python -m tests.dashboards.engine_expositions)."""
    for path, text in rec.render().items():
        assert path.read_text() == text, f"{path.name} is stale"


def test_each_view_reads_only_its_dialect() -> None:
    for dialect, stem in VIEWS.items():
        other = [p for d, p in PREFIX.items() if d != dialect]
        for where, expr in all_queries({stem: _board(stem)}):
            assert not any(p in expr for p in other), where


def test_sglang_view_leaves_out_exactly_the_listed_panels() -> None:
    vllm = [p.title for p in _board(VIEWS["vllm"]).panels()]
    sglang = [p.title for p in _board(VIEWS["sglang"]).panels()]
    assert [t for t in vllm if t not in sglang] == list(LEFT_OUT_OF_SGLANG)
    description = _board(VIEWS["sglang"]).description
    for title in ("Batch size (iteration tokens)", "Decode time"):
        assert title in description


def test_vllm_view_unchanged_by_the_mapping() -> None:
    """The vLLM view is the dashboard the sim proves; its engine queries name the vLLM series directly."""
    view = serving.dashboard(load_slos(), "vllm")
    exprs = [t.expr for p in view.panels() for t in p.targets]
    assert 'sum(vllm:num_requests_running{job="loadlens-serve", model_name=~"$model", instance=~"$instance"})' in exprs
    assert not any("label_replace" in e for e in exprs)


def test_docs_show_the_mapping() -> None:
    """docs/metrics.md's sglang table has one row per entry: the vLLM series and its sglang counterpart or none."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    for entry in ENGINE_SERIES:
        sglang = f"`{entry.sglang.name}`" if entry.sglang else "none"
        row = re.search(rf"^\| `{re.escape(entry.vllm)}`[^|]* \| ([^|]+) \|", text, re.MULTILINE)
        assert row is not None, f"docs/metrics.md has no row for {entry.vllm}"
        assert row.group(1).strip().startswith(sglang), (entry.vllm, row.group(1))


# --- in a real Prometheus -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    work = tmp_path_factory.mktemp("engine-dialects")
    parts = [with_target_labels(FIXTURE[d].read_text(), SERVE_JOB, INSTANCE[d]) for d in VIEWS]
    combined = "".join(p.removesuffix("# EOF\n") for p in parts) + "# EOF\n"
    with prometheus_on_openmetrics(work, combined) as prom:
        yield prom


def _values(prom: PrometheusServer, expr: str) -> dict[float, float]:
    """Timestamp -> the sum over the result's series (NaN steps dropped)."""
    data = prom.api("query_range", query=_concrete(expr), start=str(START), end=str(END), step=str(STEP))
    out: dict[float, float] = {}
    for series in data["result"]:
        for ts, value in series["values"]:
            if not math.isnan(float(value)):
                out[float(ts)] = out.get(float(ts), 0.0) + float(value)
    return out


@pytest.mark.slow
def test_every_engine_query_has_data_on_the_recording(recorded: PrometheusServer) -> None:
    vllm_queries = {expr for _, expr in all_queries({VIEWS["vllm"]: _board(VIEWS["vllm"])})}
    empty, engine = [], []
    for dialect, stem in VIEWS.items():
        for where, expr in all_queries({stem: _board(stem)}):
            if PREFIX[dialect] not in expr:
                # loadlens's own series (and the annotations): the same query as the vLLM view's, which
                # tests/dashboards/test_live_data.py proves against a live sim run.
                assert expr in vllm_queries, f"{where} reads no {dialect} series and is proven nowhere"
                continue
            engine.append(where)
            if not _values(recorded, expr):
                empty.append(where)
    assert set(EXPECTED_EMPTY) <= set(engine), "EXPECTED_EMPTY names a query that is gone"
    assert sorted(empty) == sorted(EXPECTED_EMPTY), "\n".join(sorted(set(empty) ^ set(EXPECTED_EMPTY)))
    assert len([w for w in engine if w.startswith(VIEWS["sglang"])]) == 11


@pytest.mark.slow
def test_both_views_show_the_same_numbers(recorded: PrometheusServer) -> None:
    vllm, sglang = _targets(VIEWS["vllm"]), _targets(VIEWS["sglang"])
    for key in SAME_VALUES:
        a, b = _values(recorded, vllm[key]), _values(recorded, sglang[key])
        assert len(a) == len(range(START, END + 1, STEP)), key
        # vLLM creates its counters at 0; sglang creates one on first use, so its rate() has no data until two
        # samples exist and, for one rate window, may miss the increments it was created with (it reads less).
        assert b.keys() <= a.keys(), key
        created = min(b)
        assert all(t < created for t in a.keys() - b.keys()), key
        assert all(b[t] <= a[t] + 1e-12 for t in b if t < created + RATE_WINDOW), key
        same = [t for t in b if t >= created + RATE_WINDOW]
        assert len(same) >= 5, key
        assert all(math.isclose(a[t], b[t], rel_tol=1e-9, abs_tol=1e-12) for t in same), (key, a, b)
        assert any(b[t] > 0 for t in same), f"{key}: all zero on the recording, which proves little"
