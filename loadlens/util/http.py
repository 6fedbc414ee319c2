"""Tiny stdlib HTTP helpers for the operator tools (no third-party client needed to ask a health URL)."""

from __future__ import annotations

import urllib.error
import urllib.request


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """True when ``GET url`` answers 200 within ``timeout``; any failure (refused, timeout, 5xx) is False."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False
