"""The run's verdict, computed here and nowhere else: pass/fail against the SLO file, and the alerts and
pages of the run's window. ``loadlens load`` (``loadgen/cli.py``) computes it once the run has ended and
writes it into the result file; the demo and the report only show it.

- ``checks.py``: the pure part: a parsed ``benchmark_result.json``, the SLO file and what was observed give a
  :class:`~loadlens.contracts.results.Verdict` with its one-line headline;
- ``observer.py``: what was observed: the window's alerts (Prometheus) and pages (the pager), after a bounded
  wait for them to settle;
- ``console.py``: the verdict as the console shows it.
"""
