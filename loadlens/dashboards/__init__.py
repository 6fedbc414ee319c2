"""Grafana dashboards as code: a small typed builder (``model``), one module per loadlens dashboard
(``overview``, ``gpu``, ``serving``) over shared selectors and variables (``common``), and ``catalog``,
which maps file stems to dashboards for the generator (``loadlens.codegen.dashboards``)."""
