"""One collector per concern; each module registers itself (:mod:`exporters.gpu.registration`).

Importing this package registers them all. The import order below is the registration order, and so the
order of the ``--collectors`` names in help and errors and of the ``default`` set: keep it.
"""

from __future__ import annotations

# The order is the registration order.
# isort: off
from exporters.gpu.collectors import (  # noqa: F401  (imported to register)
    device,
    utilization,
    memory,
    processes,
    power,
    clock_events,
    errors,
    allocator,
    pcie,
    dcgm,
    gpm,
    probe,
)

# isort: on
from exporters.gpu.registration import COLLECTORS

# Enabled unless --collectors says otherwise: those registered with default=True (pcie, dcgm and probe are
# not; the CLI adds probe when --probe-dir is given).
DEFAULT_COLLECTORS: tuple[str, ...] = COLLECTORS.defaults()

__all__ = ["COLLECTORS", "DEFAULT_COLLECTORS"]
