"""Collector self-registration: the names, their order and the defaults are unchanged; duplicates and
unselectable names are refused; ``--collectors`` and the exporter build from whatever table they are given.
Mechanism tests use a fresh :class:`CollectorRegistrations` each, never the process-wide one."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable

import pytest
from prometheus_client.core import Metric

from exporters.gpu import cli
from exporters.gpu.collector import GpuCollector, Scrape, gauge
from exporters.gpu.collectors import COLLECTORS, DEFAULT_COLLECTORS
from exporters.gpu.collectors.power import PowerCollector
from exporters.gpu.nvml import Nvml
from exporters.gpu.registration import BuildContext, CollectorRegistrations
from exporters.gpu.server import GpuExporter
from exporters.gpu.sim import SimNvml
from exporters.gpu.sim_sources import StaticSource
from loadlens.util.cliutil import UsageError
from tests.gpu.helpers import default_state

ALL = (
    "device",
    "utilization",
    "memory",
    "processes",
    "power",
    "clock_events",
    "errors",
    "allocator",
    "pcie",
    "dcgm",
    "gpm",
    "probe",
)


class Probe(GpuCollector):
    name = "probe"

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        g = gauge("probe_devices", "Devices the probe saw.", [])
        g.add_metric([], float(len(scrape.devices())))
        yield g


def probe(ctx: BuildContext) -> Probe:
    return Probe(ctx.session, timer=ctx.timer, clock=ctx.clock)


def fresh(*entries: tuple[str, bool]) -> CollectorRegistrations:
    table = CollectorRegistrations()
    for name, default in entries:
        table.register(name, default=default, factory=probe)
    return table


def exporter(**kwargs: object) -> GpuExporter:
    nvml = Nvml(SimNvml(StaticSource(default_state()), max_age=0.0, clock=lambda: 0.0))
    return GpuExporter(nvml, backend="sim", proc_root=None, **kwargs)  # type: ignore[arg-type]


def test_registered_names_order_and_defaults_unchanged() -> None:
    assert COLLECTORS.names() == ALL
    assert tuple(COLLECTORS) == ALL
    assert len(COLLECTORS) == 12
    assert COLLECTORS.defaults() == (*ALL[:8], "gpm")  # pcie, dcgm and probe are opt-in
    assert COLLECTORS.defaults() == DEFAULT_COLLECTORS


def test_help_lists_the_registered_defaults() -> None:
    # The help text is written out (building the parser must not import the collectors): keep it in step.
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["gpu-exporter"]
    text = next(a.help for a in sub._actions if a.dest == "collectors")
    assert text is not None
    listed = re.search(r"'default' = ([a-z_,]+);", text)
    assert listed is not None
    assert tuple(listed.group(1).split(",")) == DEFAULT_COLLECTORS


def test_unknown_collector_message_unchanged() -> None:
    with pytest.raises(UsageError) as info:
        cli.parse_collectors("memory,fans", False)
    assert str(info.value) == f"unknown collector 'fans'; choose from default, {', '.join(ALL)}"


def test_parse_collectors_uses_the_table_given() -> None:
    table = fresh(("b", True), ("a", False), ("c", True))
    assert cli.parse_collectors("default", False, table) == ["b", "c"]
    assert cli.parse_collectors("a,default,a", False, table) == ["a", "b", "c"]
    with pytest.raises(UsageError) as info:
        cli.parse_collectors("memory", False, table)
    assert str(info.value) == "unknown collector 'memory'; choose from default, b, a, c"


def test_defaults_follow_registration_order() -> None:
    table = fresh(("z", True), ("y", False), ("x", True))
    assert table.names() == ("z", "y", "x")
    assert table.defaults() == ("z", "x")
    assert ("y" in table, "w" in table) == (True, False)


def test_duplicate_registration_rejected() -> None:
    table = fresh(("probe", True))
    with pytest.raises(ValueError) as info:
        table.register("probe", default=False, factory=probe)
    assert str(info.value) == "collector 'probe' is already registered"
    assert table.defaults() == ("probe",)  # the first registration stands


def test_registering_a_builtin_name_again_is_rejected() -> None:
    with pytest.raises(ValueError) as info:
        COLLECTORS.register("memory", default=True, factory=probe)
    assert str(info.value) == "collector 'memory' is already registered"
    assert COLLECTORS.names() == ALL


@pytest.mark.parametrize("name", ["", "default", "a,b"])
def test_unselectable_names_rejected(name: str) -> None:
    table = CollectorRegistrations()
    with pytest.raises(ValueError) as info:
        table.register(name, default=True, factory=probe)
    assert str(info.value) == f"invalid collector name {name!r}"
    assert table.names() == ()


def test_factory_must_build_the_collector_it_names() -> None:
    table = CollectorRegistrations()
    table.register("power", default=True, factory=probe)
    with pytest.raises(ValueError) as info:
        exporter(collectors=["power"], available=table)
    assert str(info.value) == "collector registered as 'power' calls itself 'probe'"


def test_exporter_builds_from_the_table_given() -> None:
    seen: list[BuildContext] = []

    def capture(ctx: BuildContext) -> Probe:
        seen.append(ctx)
        return probe(ctx)

    table = CollectorRegistrations()
    table.register("probe", default=True, factory=capture)
    timer, clock = (lambda: 0.0), (lambda: 5.0)
    exp = exporter(
        collectors=["probe", "probe"], available=table, max_processes=7, hostname="h", timer=timer, clock=clock
    )
    assert [c.name for c in exp.collector.collectors] == ["probe"]  # duplicates dropped, built once
    [ctx] = seen
    assert (ctx.session, ctx.sampler) == (exp.session, exp.sampler)
    assert (ctx.max_processes, ctx.proc_root, ctx.hostname, ctx.timer, ctx.clock) == (7, None, "h", timer, clock)
    exp.sample_now()
    assert exp.registry.get_sample_value("loadlens_gpu_probe_devices") == 2.0
    assert exp.registry.get_sample_value("loadlens_gpu_collector_success", {"collector": "probe"}) == 1.0


def test_exporter_rejects_names_missing_from_its_table() -> None:
    with pytest.raises(ValueError) as info:
        exporter(collectors=["probe", "power"], available=fresh(("probe", True)))
    assert str(info.value) == "unknown collectors ['power']; choose from probe"


def test_builtin_factories_build_their_own_class() -> None:
    exp = exporter(collectors=list(ALL), hostname="h")
    assert [c.name for c in exp.collector.collectors] == list(ALL)
    assert type(exp.collector.collectors[4]) is PowerCollector
