"""The experiment's usage error: a broken experiment file, parameter or template (models.py, adapter_spec.py)."""

from __future__ import annotations


class ExperimentError(ValueError):
    """A broken experiment file or parameter; the message names the field."""
