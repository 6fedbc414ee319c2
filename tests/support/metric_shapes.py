"""The shape of a Prometheus text exposition, family by family: type, label names and histogram buckets.

Two servers that claim the same metrics (the sim and a real vLLM) are compared by shape, not by value:
``diff(a, b)`` lists every family, type, label name and bucket layout that differs, one line each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')
_LE = re.compile(r'(?:^|,)le="([^"]*)"')
# prometheus_client's sample suffixes (text format 0.0.4: a counter's family is named with its _total).
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_gsum", "_gcount")


@dataclass(frozen=True)
class Family:
    type: str
    labels: frozenset[str]
    """Label names on any of its samples, ``le`` and ``quantile`` excepted."""
    buckets: tuple[str, ...]
    """A histogram's ``le`` bounds as written, in order; empty for other types."""


def shapes(text: str, prefix: str = "") -> dict[str, Family]:
    """Every family whose name starts with ``prefix``; ``_created`` families (prometheus_client's series
    creation times) are left out."""
    types: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    buckets: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            if name.startswith(prefix) and not name.endswith("_created"):
                types[name], labels[name], buckets[name] = kind, set(), []
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        family = _family(match.group(1), types)
        if family is None:
            continue
        raw = match.group(2) or ""
        labels[family] |= set(_LABEL.findall(raw)) - {"le", "quantile"}
        le = _LE.search(raw)
        if le and match.group(1).endswith("_bucket") and le.group(1) not in buckets[family]:
            buckets[family].append(le.group(1))
    return {name: Family(types[name], frozenset(labels[name]), tuple(buckets[name])) for name in types}


def _family(sample: str, types: dict[str, str]) -> str | None:
    if sample in types:
        return sample
    for suffix in _SUFFIXES:
        if sample.endswith(suffix) and sample[: -len(suffix)] in types:
            return sample[: -len(suffix)]
    return None


def diff(a: dict[str, Family], b: dict[str, Family], a_name: str = "a", b_name: str = "b") -> set[str]:
    """One line per difference: a family only on one side, its type, a label name only on one side, its
    bucket layout."""
    out = {f"family only in {a_name}: {n}" for n in a.keys() - b.keys()}
    out |= {f"family only in {b_name}: {n}" for n in b.keys() - a.keys()}
    for name in a.keys() & b.keys():
        fa, fb = a[name], b[name]
        if fa.type != fb.type:
            out.add(f"type of {name}: {a_name} {fa.type}, {b_name} {fb.type}")
        out |= {f"label only in {a_name}: {name} {label}" for label in fa.labels - fb.labels}
        out |= {f"label only in {b_name}: {name} {label}" for label in fb.labels - fa.labels}
        if fa.buckets != fb.buckets:
            out.add(f"buckets of {name}: {a_name} {list(fa.buckets)}, {b_name} {list(fb.buckets)}")
    return out
