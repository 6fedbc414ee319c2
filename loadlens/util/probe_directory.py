"""Reads the probe documents in a shared directory (node_exporter's textfile-collector pattern).

Every scrape lists ``probe-*.json`` (hidden temporaries are skipped: writers rename them into place), and
keeps a document only if it parses, has a known version, is fresh (``written_at`` within
``stale_after(interval_seconds)``) and its process is still the one that wrote it. The pid check needs the
exporter in the writer's PID namespace (``hostPID`` or a shared process namespace): the document names its
namespace, and where it differs from the exporter's, or the exporter cannot read its own, the check is
skipped and staleness alone retires the document. Nothing here raises for a bad file; every drop has one
of :data:`DROP_REASONS`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from loadlens.contracts.probe_document import (
    FILE_PREFIX,
    FILE_SUFFIX,
    MAX_DOCUMENT_BYTES,
    PROBE_DOCUMENT_VERSION,
    ProbeDocument,
    stale_after,
)
from loadlens.util.procstat import pid_namespace, start_time_ticks

log = logging.getLogger(__name__)

DROP_REASONS = ("corrupt", "version", "stale", "pid_gone", "pid_reused", "duplicate", "too_large", "too_many")
MAX_DOCUMENTS = 1024


@dataclass
class ReadResult:
    documents: list[ProbeDocument] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)  # this scrape, by reason
    listed: bool = True  # False when the directory could not be listed (not merely missing)


class ProbeReader:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        proc_root: str | None = "/proc",
        clock: Callable[[], float] = time.time,
        max_documents: int = MAX_DOCUMENTS,
    ) -> None:
        self.directory = Path(directory)
        self._proc = proc_root
        self._clock = clock
        self._max = max_documents
        self._own_ns = pid_namespace("self", proc_root) if proc_root is not None else None
        # A bad file counts once per version of it (name -> (mtime_ns, size)), not once per scrape.
        self._counted: dict[str, tuple[int, int]] = {}
        self.dropped_total: Counter[str] = Counter()

    def read(self) -> ReadResult:
        result = ReadResult()
        try:
            listing = os.scandir(self.directory)
            entries = sorted(
                (e for e in listing if e.name.startswith(FILE_PREFIX) and e.name.endswith(FILE_SUFFIX)),
                key=lambda e: e.name,
            )
        except FileNotFoundError:
            entries = []  # no probe has written yet
        except OSError as err:
            log.warning("probe directory %s cannot be listed: %s", self.directory, err)
            result.listed = False
            entries = []
        now = self._clock()
        seen: dict[str, tuple[int, int]] = {}
        kept: dict[tuple[str, int, str], ProbeDocument] = {}
        for n, entry in enumerate(entries):
            try:
                st = entry.stat()
            except OSError:
                continue  # removed between the listing and now: its writer stopped
            seen[entry.name] = (st.st_mtime_ns, st.st_size)
            doc, reason = (None, "too_many") if n >= self._max else self._load(entry.path, st.st_size, now)
            if doc is not None:
                key = (doc.pid_namespace or doc.hostname, doc.pid, doc.role)
                other = kept.get(key)
                if other is not None:  # the same process twice (a renamed copy): keep the newest
                    if other.written_at >= doc.written_at:
                        doc, reason = None, "duplicate"
                    else:
                        self._count(result, entry.name, seen, "duplicate")
                if doc is not None:
                    kept[key] = doc
                    continue
            if reason:
                self._count(result, entry.name, seen, reason)
        result.documents = list(kept.values())
        self._counted = {k: v for k, v in self._counted.items() if k in seen}
        return result

    def _count(self, result: ReadResult, name: str, seen: dict[str, tuple[int, int]], reason: str) -> None:
        result.dropped[reason] += 1
        if self._counted.get(name) != seen[name]:
            self._counted[name] = seen[name]
            self.dropped_total[reason] += 1
            log.debug("probe document %s dropped: %s", name, reason)

    def _load(self, path: str, size: int, now: float) -> tuple[ProbeDocument | None, str]:
        if size > MAX_DOCUMENT_BYTES:
            return None, "too_large"
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_DOCUMENT_BYTES + 1)
        except OSError:
            return None, ""  # removed since the listing
        if len(raw) > MAX_DOCUMENT_BYTES:
            return None, "too_large"
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return None, "corrupt"
        if not isinstance(data, dict):
            return None, "corrupt"
        if data.get("version") != PROBE_DOCUMENT_VERSION:
            return None, "version"
        try:
            doc = ProbeDocument.model_validate(data)
        except ValidationError:
            return None, "corrupt"
        if now - doc.written_at > stale_after(doc.interval_seconds):
            return None, "stale"
        reason = self._pid_check(doc)
        return (None, reason) if reason else (doc, "")

    def _pid_check(self, doc: ProbeDocument) -> str:
        """'' when the writer still runs (or cannot be checked from here), else the drop reason."""
        if self._proc is None or self._own_ns is None or doc.pid_namespace != self._own_ns:
            return ""
        ticks = start_time_ticks(doc.pid, self._proc)
        if ticks is None:
            return "pid_gone"
        if doc.start_time_ticks is not None and ticks != doc.start_time_ticks:
            return "pid_reused"
        return ""
