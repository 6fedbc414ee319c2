"""A TCP relay that keeps what the server sent: put between a proxy and its upstream, it shows the exact
bytes the upstream wrote for the very request the proxy forwarded, so what the client got can be compared
with them, chunk boundaries and ids included (a second request to the upstream would chunk differently:
vLLM merges a stream's outputs whenever its API server falls behind its engine).

    with RecordingRelay(upstream_port) as relay:      # relay.url goes to the proxy as its --upstream
        relay.clear()
        ...                                            # a request through the proxy
        relay.sse_data_lines()                         # the upstream's SSE data lines of it, in order
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from types import TracebackType


class RecordingRelay:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._received: list[bytearray] = []  # per connection, what the upstream sent on it
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def __enter__(self) -> RecordingRelay:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            sockets = [self._listener, *self._sockets]
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def clear(self) -> None:
        """Forget what was recorded so far (connections stay open and keep recording)."""
        with self._lock:
            for buffer in self._received:
                buffer.clear()

    def received(self) -> list[bytes]:
        """What the upstream sent since the last ``clear``, one entry per connection that carried any."""
        with self._lock:
            return [bytes(buffer) for buffer in self._received if buffer]

    def bodies(self) -> list[bytes]:
        """The response bodies recorded, one entry per connection that carried any (its responses' bodies
        concatenated), with the HTTP/1.1 chunked framing taken off."""
        return [_body(raw) for raw in self.received()]

    def sse_data_lines(self) -> list[bytes]:
        """The ``data:`` lines of every response recorded, connection by connection, with the HTTP/1.1
        chunked framing taken off."""
        return [line for raw in self.received() for line in _body(raw).split(b"\n") if line.startswith(b"data: ")]

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._upstream)
            buffer = bytearray()
            with self._lock:
                self._received.append(buffer)
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, buffer), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
        try:
            while data := src.recv(65536):
                if record is not None:
                    with self._lock:
                        record += data
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


_HEAD_END = b"\r\n\r\n"
_CHUNKED = re.compile(rb"^transfer-encoding:\s*chunked\s*$", re.I | re.M)
_LENGTH = re.compile(rb"^content-length:\s*(\d+)\s*$", re.I | re.M)


def _body(raw: bytes) -> bytes:
    """The bodies of the HTTP/1.1 responses in ``raw`` (one connection's bytes), concatenated."""
    out = bytearray()
    pos = 0
    while (head_end := raw.find(_HEAD_END, pos)) != -1:
        head = raw[pos:head_end]
        pos = head_end + len(_HEAD_END)
        if _CHUNKED.search(head):
            while (line_end := raw.find(b"\r\n", pos)) != -1:
                size = int(raw[pos:line_end].split(b";")[0], 16)
                pos = line_end + 2
                if size == 0:
                    pos = raw.find(b"\r\n", pos) + 2  # no trailers from these servers: the closing CRLF
                    break
                out += raw[pos : pos + size]
                pos += size + 2
        elif length := _LENGTH.search(head):
            out += raw[pos : pos + int(length.group(1))]
            pos += int(length.group(1))
        else:
            out += raw[pos:]  # read until close
            break
    return bytes(out)
