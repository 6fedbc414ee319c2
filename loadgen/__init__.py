"""loadlens load generator: Locust users that stream from OpenAI-compatible servers and measure them exactly.

Run ``loadlens load --profile quick --host http://127.0.0.1:8000 --headless`` or
``locust -f loadgen/locustfile.py``; see docs/loadgen.md.
"""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("loadlens")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+src"
