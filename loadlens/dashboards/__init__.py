"""Grafana dashboards as code: a small typed builder (``model``), the loadlens dashboards (``catalog``) and
the generator that writes ``dashboards/`` (``generate``)."""
