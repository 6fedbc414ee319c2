"""loadlens: exporters (serving layer, GPU exporter) and the shared pieces they use."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("loadlens")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"
