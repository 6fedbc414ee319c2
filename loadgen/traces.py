"""Trace files for replay: Mooncake JSONL, BurstGPT CSV and Azure LLM inference CSV, read into rows.

Each row is an arrival offset (seconds of trace time since the first replayed row), the prompt and output
lengths in tokens, and, for Mooncake, the prompt's block hashes. A profile's trace stage (``loadgen/profile.py``)
reads its file with :func:`read_trace` when the profile is loaded, so a broken file stops the run before
anything starts, with the file, line and column::

    data = read_trace(Path("t.jsonl"), "mooncake")
    data.rows[0].at, data.rows[0].input_tokens, data.rows[0].hash_ids     # 0.0, 6755, (0, 1, ..., 13)

The formats, as their publishers describe them (docs/loadgen.md, *Trace replay*):

- Mooncake (kvcache-ai/Mooncake ``FAST25-release/traces``): one JSON object per line with ``timestamp``
  (milliseconds since the first request), ``input_length``, ``output_length`` and ``hash_ids`` (one id per
  block of 512 prompt tokens, the last block partial; equal leading ids mean a shared prompt prefix).
- BurstGPT (HPMLL/BurstGPT): CSV with ``Timestamp`` (seconds since the trace's first day began), ``Model``,
  ``Request tokens``, ``Response tokens``, ``Total tokens``, ``Log Type``; failed requests have 0 response
  tokens.
- Azure LLM inference traces 2023 and 2024 (Azure/AzurePublicDataset): CSV with ``TIMESTAMP`` (a date and
  time: ``2023-11-16 18:17:03.9799600``, or ``2024-05-10 00:00:00.009930+00:00``), ``ContextTokens`` and
  ``GeneratedTokens``.

Rows with a zero prompt or output length (BurstGPT's failures) are skipped and counted; they cannot be
replayed as requests. Timestamps must not decrease: a trace out of order is refused rather than re-sorted,
so ``start``, ``end`` and ``limit`` select the rows the file shows.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

TraceFormat = Literal["mooncake", "burstgpt", "azure"]
FORMATS: tuple[TraceFormat, ...] = ("mooncake", "burstgpt", "azure")
MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in the Mooncake traces."""

BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
"""The BurstGPT columns a replay reads (the file's ``Total tokens`` and ``Log Type`` are not needed)."""
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceError(ValueError):
    """A trace file cannot be replayed. The message starts with ``file:line:column`` (or ``file:line``)."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of the trace as it is replayed."""

    index: int
    """Position among the replayed rows (0-based)."""
    line: int
    """Line in the file (1-based), for messages."""
    at: float
    """Seconds of trace time since the first replayed row (unscaled)."""
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None = None
    """Mooncake: the prompt's block hashes; None for formats without them."""
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    """Prompt tokens per hash id."""
    stage: str = ""
    """The stage replaying the row (set when it is scheduled): rows without hash ids get text of their own."""


@dataclass(frozen=True, eq=False)
class TraceData:
    """The rows a trace stage replays, and where they came from."""

    path: Path
    format: TraceFormat
    sha256: str
    """Of the whole file, whatever part is replayed."""
    rows: tuple[TraceRow, ...]
    rows_skipped: int
    """Rows inside the selection left out: a zero prompt or output length, or another BurstGPT model."""

    @property
    def span(self) -> float:
        """Trace seconds from the first replayed row to the last."""
        return self.rows[-1].at if self.rows else 0.0


def detect_format(path: Path) -> TraceFormat:
    """The format of ``path``: JSON lines are Mooncake; a CSV header tells BurstGPT from Azure."""
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            first = fh.readline()
    except OSError as err:
        raise TraceError(f"{path}: cannot read: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}:1: not UTF-8 text ({err.reason})") from err
    if first.lstrip().startswith("{"):
        return "mooncake"
    header = [h.strip() for h in next(csv.reader([first]), [])]
    if "Request tokens" in header:
        return "burstgpt"
    if "ContextTokens" in header:
        return "azure"
    raise TraceError(
        f"{path}:1: not a known trace format (Mooncake JSON lines, a BurstGPT CSV with 'Request tokens', an Azure "
        "CSV with 'ContextTokens'); set trace.format"
    )


def read_trace(
    path: Path,
    fmt: TraceFormat,
    *,
    start: float = 0.0,
    end: float | None = None,
    limit: int | None = None,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    model: str | None = None,
) -> TraceData:
    """The rows of ``path`` whose time, in seconds after the file's first row, is in [start, end), at most
    ``limit`` of them; BurstGPT rows of ``model`` only when given. Raises :class:`TraceError`."""
    stat = _stat(path)
    return _read_cached(path, stat, fmt, start, end, limit, block_tokens, model)


def _stat(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError as err:
        raise TraceError(f"{path}: cannot read: {err.strerror}") from err
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=8)
def _read_cached(
    path: Path,
    stat: tuple[int, int],  # part of the cache key: an edited file is read again
    fmt: TraceFormat,
    start: float,
    end: float | None,
    limit: int | None,
    block_tokens: int,
    model: str | None,
) -> TraceData:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as err:
        raise TraceError(f"{path}: cannot read: {err.strerror}") from err
    if fmt == "mooncake":
        records = _mooncake(path, block_tokens)
    elif fmt == "burstgpt":
        records = _burstgpt(path, model)
    else:
        records = _azure(path)
    rows: list[TraceRow] = []
    skipped = 0
    first: float | None = None
    previous: tuple[float, int] | None = None
    base = 0.0
    for line, t, n_in, n_out, hashes, keep in records:
        if previous is not None and t < previous[0]:
            raise TraceError(
                f"{path}:{line}: time goes backwards ({_fmt_s(t - (first or 0.0))} after the first row, line "
                f"{previous[1]} was at {_fmt_s(previous[0] - (first or 0.0))}): traces must be in time order"
            )
        previous = (t, line)
        if first is None:
            first = t
        rel = t - first
        if rel < start:
            continue
        if end is not None and rel >= end:
            break
        if not keep or n_in == 0 or n_out == 0:
            skipped += 1
            continue
        if not rows:
            base = t
        rows.append(TraceRow(len(rows), line, t - base, n_in, n_out, hashes, block_tokens))
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        where = f" in [{start:g} s, {end:g} s)" if end is not None else (f" from {start:g} s" if start else "")
        raise TraceError(f"{path}: no row to replay{where} ({skipped} skipped: zero lengths or another model)")
    return TraceData(path=path, format=fmt, sha256=digest.hexdigest(), rows=tuple(rows), rows_skipped=skipped)


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.6g} s"


Record = tuple[int, float, int, int, tuple[int, ...] | None, bool]
"""(line, time in seconds, prompt tokens, output tokens, hash ids, kept by the filters)."""


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            yield from enumerate(fh, start=1)
    except OSError as err:
        raise TraceError(f"{path}: cannot read: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not UTF-8 text ({err.reason})") from err


def _column(text: str, key: str) -> int:
    """1-based column of ``"key"`` in a JSON line (1 when not found)."""
    at = text.find(f'"{key}"')
    return at + 1 if at >= 0 else 1


def _whole(value: Any) -> int | None:
    """A token count: a whole number >= 0 (``12`` or ``12.0``), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    return None


def _mooncake(path: Path, block_tokens: int) -> Iterator[Record]:
    for line, text in _lines(path):
        if not text.strip():
            continue
        try:
            obj = json.loads(text.rstrip("\r\n"))  # without the newline an error's column stays on this line
        except json.JSONDecodeError as err:
            raise TraceError(f"{path}:{line}:{err.colno}: not valid JSON: {err.msg}") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{path}:{line}:1: must be a JSON object, got {type(obj).__name__}")
        ts = obj.get("timestamp")
        if ts is None:
            raise TraceError(
                f"{path}:{line}:1: timestamp: missing (arrival in ms since the first request; session traces "
                "with 'delay' are not replayed)"
            )
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
            raise TraceError(
                f"{path}:{line}:{_column(text, 'timestamp')}: timestamp: must be milliseconds >= 0, got {ts!r}"
            )
        counts = []
        for key in ("input_length", "output_length"):
            n = _whole(obj.get(key))
            if n is None:
                raise TraceError(
                    f"{path}:{line}:{_column(text, key)}: {key}: must be a whole number >= 0, got {obj.get(key)!r}"
                )
            counts.append(n)
        hashes: tuple[int, ...] | None = None
        if obj.get("hash_ids") is not None:
            raw = obj["hash_ids"]
            col = _column(text, "hash_ids")
            if not isinstance(raw, list) or not all(_whole(h) is not None for h in raw):
                raise TraceError(f"{path}:{line}:{col}: hash_ids: must be a list of whole numbers >= 0")
            hashes = tuple(int(h) for h in raw)
            blocks = -(-counts[0] // block_tokens)
            if len(hashes) != blocks:
                raise TraceError(
                    f"{path}:{line}:{col}: hash_ids: {len(hashes)} blocks for input_length {counts[0]}, which needs "
                    f"{blocks} of {block_tokens} tokens (the last one partial); set trace.block_size if the trace "
                    "used another block size"
                )
        yield line, float(ts) / 1000.0, counts[0], counts[1], hashes, True


def _csv_rows(path: Path, needed: tuple[str, ...], name: str) -> Iterator[tuple[int, dict[str, str]]]:
    """(line, {column: value}) for each data row, after checking the header has ``needed``."""
    lines = _lines(path)
    header_line = next(lines, None)
    if header_line is None:
        raise TraceError(f"{path}:1: empty file (a {name} CSV starts with its header)")
    header = [h.strip() for h in next(csv.reader([header_line[1]]), [])]
    missing = [c for c in needed if c not in header]
    if missing:
        raise TraceError(
            f"{path}:1: header lacks {', '.join(repr(c) for c in missing)} (a {name} CSV has {', '.join(needed)})"
        )
    index = {c: header.index(c) for c in needed}
    for line, text in lines:
        if not text.strip():
            continue
        fields = next(csv.reader([text]), [])
        if len(fields) < len(header):
            raise TraceError(f"{path}:{line}: {len(fields)} columns, the header has {len(header)}")
        yield line, {c: fields[i].strip() for c, i in index.items()}


def _field_error(path: Path, line: int, column: str, reason: str, value: str) -> TraceError:
    return TraceError(f"{path}:{line}: column {column!r}: {reason}, got {value!r}")


def _count(path: Path, line: int, row: dict[str, str], column: str) -> int:
    value = row[column]
    try:
        n = float(value)
    except ValueError:
        n = -1.0
    if not (math.isfinite(n) and n >= 0 and n.is_integer()):
        raise _field_error(path, line, column, "must be a whole number >= 0", value)
    return int(n)


def _burstgpt(path: Path, model: str | None) -> Iterator[Record]:
    for line, row in _csv_rows(path, BURSTGPT_COLUMNS, "BurstGPT"):
        value = row["Timestamp"]
        try:
            ts = float(value)
        except ValueError:
            ts = math.nan
        if not math.isfinite(ts) or ts < 0:
            raise _field_error(path, line, "Timestamp", "must be seconds >= 0", value)
        n_in = _count(path, line, row, "Request tokens")
        n_out = _count(path, line, row, "Response tokens")
        yield line, ts, n_in, n_out, None, model is None or row["Model"] == model


def _azure_time(value: str) -> float | None:
    """Seconds since the epoch of an Azure ``TIMESTAMP``; a time without an offset is UTC."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    seconds = moment.timestamp()
    # fromisoformat keeps microseconds; the 2023 files have a seventh digit (100 ns) worth keeping.
    digits = re.match(r"\d*", value.split(".", 1)[1]).group() if "." in value else ""  # type: ignore[union-attr]
    if len(digits) > 6:
        seconds += int(digits[6:]) / 10 ** len(digits)
    return seconds


def _azure(path: Path) -> Iterator[Record]:
    for line, row in _csv_rows(path, AZURE_COLUMNS, "Azure LLM inference"):
        value = row["TIMESTAMP"]
        ts = _azure_time(value)
        if ts is None:
            raise _field_error(
                path, line, "TIMESTAMP", "must be a date and time like 2023-11-16 18:17:03.9799600", value
            )
        n_in = _count(path, line, row, "ContextTokens")
        n_out = _count(path, line, row, "GeneratedTokens")
        yield line, ts, n_in, n_out, None, True
