"""Run an ASGI app on a real uvicorn server in a background thread, on 127.0.0.1 and a free port."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from loadlens.util.net import free_port

__all__ = ["free_port", "raw_stream", "serve_app"]


@contextlib.contextmanager
def serve_app(app: Any, *, timeout_s: float = 30.0, **options: Any) -> Iterator[str]:
    """Yield the base URL (``http://127.0.0.1:PORT``) while the app runs; stop it on exit. ``options``: more
    ``uvicorn.Config`` settings (e.g. ``timeout_keep_alive``).

    The listening socket is bound here, once, and handed to uvicorn: a port picked by number and bound later
    could be taken in between by another process or a loopback client's ephemeral port."""
    # proto IPPROTO_TCP, as getaddrinfo gives it: asyncio sets TCP_NODELAY on accepted sockets only for that
    # proto, and without it Nagle holds small responses for the client's delayed ACK (~40 ms a request).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            loop="asyncio",
            http="httptools",
            log_level="warning",
            access_log=False,
            **options,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on port {port}")
            time.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            thread.join(timeout=timeout_s)
    finally:
        sock.close()  # uvicorn closes it on shutdown; this covers a server that never started


@contextlib.contextmanager
def raw_stream(base_url: str, path: str, body: dict[str, Any], *, until: bytes, count: int = 1) -> Iterator[bytes]:
    """POST ``body`` over a bare socket, read until ``until`` appeared ``count`` times, yield what was read,
    then drop the connection without a goodbye: a client that goes away mid-stream."""
    host, port = base_url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        received = b""
        while received.count(until) < count:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"server closed the connection; received {received[-300:]!r}")
            received += chunk
        yield received
