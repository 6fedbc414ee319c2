"""One reader of a Prometheus text exposition's label set (the inside of a sample's braces), for the parsers
that read a server's ``/metrics`` without a Prometheus: the KV capacity (``kv_capacity.py``) and the hot-swap
series (loadlens/experiment/swap_series.py)."""

from __future__ import annotations

ESCAPES = {"n": "\n"}
"""The exposition's escapes besides ``\\\\`` and ``\\"`` (each of which stands for the character itself)."""


def parse_labels(text: str) -> list[tuple[str, str]]:
    """``a="x",b="y"`` as (name, value) pairs in their order, escapes undone."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        eq = text.find("=", i)
        if eq < 0:
            break
        name = text[i:eq].strip().lstrip(",").strip()
        j = text.find('"', eq) + 1
        value: list[str] = []
        while 0 < j < n and text[j] != '"':
            if text[j] == "\\" and j + 1 < n:
                j += 1
                value.append(ESCAPES.get(text[j], text[j]))
            else:
                value.append(text[j])
            j += 1
        out.append((name, "".join(value)))
        if j <= 0:
            break
        i = j + 1
    return out
