"""The one client of Prometheus's HTTP API (``/api/v1/query`` and ``query_range``), on urllib.

Two failures are told apart because callers treat them differently: :class:`PrometheusUnreachable` (nothing
Prometheus-like answered: connection refused, DNS, timeout, not JSON) stops a whole report or a run's
server-side figures at once, while :class:`QueryError` (Prometheus refused one expression) is noted beside
that figure or panel and the rest go on.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any


class PrometheusUnreachable(RuntimeError):
    """Prometheus did not answer at all (connection refused, DNS, timeout, not an API)."""


class QueryError(RuntimeError):
    """Prometheus answered but refused one query (bad PromQL, too many points)."""


class PrometheusClient:
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: Mapping[str, str], timeout: float) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as err:
            try:
                doc = json.loads(err.read())
            except ValueError:
                raise QueryError(f"HTTP {err.code}") from None
            raise QueryError(str(doc.get("error", f"HTTP {err.code}"))) from None
        except (urllib.error.URLError, OSError, TimeoutError) as err:
            reason = getattr(err, "reason", err)
            raise PrometheusUnreachable(f"cannot reach Prometheus at {self.url}: {reason}") from None
        try:
            doc = json.loads(body)
        except ValueError:
            raise PrometheusUnreachable(f"{self.url} did not answer like a Prometheus API (not JSON)") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise QueryError(str(doc.get("error", doc) if isinstance(doc, dict) else doc))
        return doc["data"]

    def check(self, timeout: float = 3.0) -> None:
        """Fail fast when nothing Prometheus-like answers at the URL."""
        try:
            self._get("query", {"query": "1"}, timeout=timeout)
        except QueryError as err:
            raise PrometheusUnreachable(f"{self.url} did not answer like a Prometheus API: {err}") from None

    def query_range(self, expr: str, start: float, end: float, step: int) -> list[dict[str, Any]]:
        """A range query's matrix: ``[{"metric": {...}, "values": [[t, "v"], ...]}, ...]``."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": str(step)}
        data = self._get("query_range", params, self.timeout)
        result: list[dict[str, Any]] = data.get("result", [])
        return result

    def value_at(self, expr: str, at: float) -> float | None:
        """An instant query's single number: a scalar, or the first sample of a vector; None when the result
        is empty or not finite (NaN from 0/0, ±Inf from histogram_quantile on empty buckets)."""
        data = self._get("query", {"query": expr, "time": f"{at:.3f}"}, self.timeout)
        result = data.get("result")
        try:
            if data.get("resultType") == "scalar":
                value = float(result[1])
            elif isinstance(result, list) and result:
                value = float(result[0]["value"][1])
            else:
                return None
        except (KeyError, IndexError, TypeError, ValueError):
            raise QueryError(f"unexpected result shape for {expr!r}: {result!r}") from None
        return value if math.isfinite(value) else None

    def vector_at(self, expr: str, at: float) -> list[tuple[dict[str, str], float]]:
        """An instant query's vector: (labels, value) per series, finite values only."""
        data = self._get("query", {"query": expr, "time": f"{at:.3f}"}, self.timeout)
        result = data.get("result")
        if data.get("resultType") != "vector" or not isinstance(result, list):
            raise QueryError(f"unexpected result shape for {expr!r}: {result!r}")
        out: list[tuple[dict[str, str], float]] = []
        try:
            for series in result:
                value = float(series["value"][1])
                if math.isfinite(value):
                    out.append((dict(series["metric"]), value))
        except (KeyError, IndexError, TypeError, ValueError):
            raise QueryError(f"unexpected result shape for {expr!r}: {result!r}") from None
        return out

    def rule_groups(self) -> list[dict[str, Any]]:
        """``/api/v1/rules``: each rule group (``interval``, ``lastEvaluation``) with its rules: an alerting rule's
        ``duration`` (the ``for:``) and active alerts (``state`` pending or firing, ``activeAt``, ``labels``); a
        recording rule has none. Recording groups are included: whether the run's last samples have been judged
        depends on them too (:mod:`loadgen.verdict.observer`)."""
        data = self._get("rules", {}, self.timeout)
        groups: list[dict[str, Any]] = data.get("groups", [])
        return groups

    def active_targets(self) -> list[dict[str, Any]]:
        """``/api/v1/targets?state=active``: each scrape target's ``labels`` (``job``), ``health`` (up, down,
        unknown), ``lastScrape`` (when the last scrape began) and ``lastScrapeDuration`` (seconds). Raises
        :class:`QueryError` where the API has no targets endpoint (a Thanos or Mimir querier)."""
        data = self._get("targets", {"state": "active"}, self.timeout)
        targets: list[dict[str, Any]] = data.get("activeTargets", [])
        return targets
