"""Where the ``sim`` backend's device-state document comes from: the sim engine over HTTP (incremental,
``?since_us=N``), a file re-read when it changes, or a fixed document (tests). Every failure to fetch or
parse is a :class:`SourceError`; the backend reports it as ``SimDocumentUnavailable``, worded as the sim
backend's failure (the URL or file and what came back), never as an NVML driver failure.

An http URL may be the sim server's base URL (``http://HOST:PORT``, what a user types): with no path, or
``/``, the document's path :data:`DEVICE_STATE_PATH` is used."""

from __future__ import annotations

import http.client
import os
import urllib.parse
from pathlib import Path
from typing import Protocol

import pydantic

from loadlens.contracts.device_state import DEVICE_STATE_PATH, DeviceState


class SourceError(Exception):
    """The device-state document could not be fetched or parsed."""


class DocumentSource(Protocol):
    def fetch(self, since_us: int) -> DeviceState:
        """The current document; utilisation samples older than ``since_us`` may be left out."""
        ...

    def close(self) -> None: ...


class StaticSource:
    """A fixed (or test-swappable) document."""

    def __init__(self, state: DeviceState) -> None:
        self.state = state
        self.fail: Exception | None = None  # tests set this to simulate an unreachable engine

    def fetch(self, since_us: int) -> DeviceState:
        if self.fail is not None:
            raise SourceError(str(self.fail))
        return self.state

    def close(self) -> None:
        return None


def parse_document(raw: bytes | str, where: str) -> DeviceState:
    try:
        return DeviceState.model_validate_json(raw)
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise SourceError(f"{where}: invalid device-state document at {loc or '<root>'}: {first['msg']}") from err


class FileSource:
    """A JSON file, parsed again only when its mtime or size changes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._state: DeviceState | None = None

    def fetch(self, since_us: int) -> DeviceState:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if self._state is None or stamp != self._stamp:
                self._state = parse_document(self.path.read_bytes(), str(self.path))
                self._stamp = stamp
        except OSError as err:
            raise SourceError(f"cannot read {self.path}: {err.strerror}") from err
        return self._state

    def close(self) -> None:
        return None


class HttpSource:
    """``GET <url>?since_us=N`` over one kept-alive connection (the sim engine serves it with uvicorn).

    ``url`` is the document's URL or the server's base URL (no path, or ``/``: the document's path is
    appended); :attr:`url` is the URL actually fetched, which every error names."""

    def __init__(self, url: str, *, timeout: float = 2.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not an http:// URL: {url!r}")
        if parts.path in ("", "/"):  # the server's base URL: the sim engine serves its document here
            parts = parts._replace(path=DEVICE_STATE_PATH)
        self.url = urllib.parse.urlunsplit(parts)
        self._host = parts.hostname or ""
        self._port = parts.port or 80
        self._path = parts.path
        self._query = urllib.parse.parse_qsl(parts.query)
        self._timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def _get(self, since_us: int) -> bytes:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        query = urllib.parse.urlencode([*self._query, ("since_us", str(since_us))])
        self._conn.request("GET", f"{self._path}?{query}", headers={"Accept": "application/json"})
        resp = self._conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            hint = ""
            if resp.status == 404 and not self._path.rstrip("/").endswith(DEVICE_STATE_PATH):
                base = self.url.split("?", 1)[0].rstrip("/")
                hint = f" (the sim engine serves its document at {DEVICE_STATE_PATH}: try --sim-url {base}"
                hint += f"{DEVICE_STATE_PATH})"
            raise SourceError(f"GET {self.url}: HTTP {resp.status}{hint}")
        return body

    def fetch(self, since_us: int) -> DeviceState:
        try:
            body = self._get(since_us)
        except (OSError, http.client.HTTPException) as first:
            # A kept-alive connection the server has since closed fails once; retry on a fresh one.
            self.close()
            try:
                body = self._get(since_us)
            except (OSError, http.client.HTTPException) as err:
                self.close()
                raise SourceError(f"GET {self.url}: {err or type(err).__name__}") from first
        return parse_document(body, self.url)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def open_source(location: str) -> DocumentSource:
    """An http(s) URL or a file path."""
    if location.startswith(("http://", "https://")):
        if location.startswith("https://"):
            raise ValueError("https is not supported for --sim-url; the sim engine serves plain http on localhost")
        return HttpSource(location)
    return FileSource(location)
