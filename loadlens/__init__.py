"""loadlens: load-test, watch and alert on LLM inference servers and their GPUs.

This package holds the ``loadlens`` command, the contracts every part shares (``contracts``), small utilities
(``util``), the operator tools (``stack``, ``pager``, ``report``, ``demo``), the rule and dashboard definitions
(``alerting``, ``dashboards``) and, in a source tree only, the generators (``codegen``). The processes that
expose metrics about the system under test live in ``exporters``; the load generator in ``loadgen``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("loadlens")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"
