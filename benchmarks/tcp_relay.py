"""A TCP relay that does nothing but forward bytes, on uvloop: the floor for any proxy's CPU per chunk.

``python -m benchmarks.tcp_relay PORT UPSTREAM_PORT`` listens on 127.0.0.1:PORT and pipes each connection to
127.0.0.1:UPSTREAM_PORT and back, one write per read, parsing nothing. Its CPU per forwarded chunk is what
the socket reads, writes and loopback TCP cost on the machine, which a measuring proxy pays too
(``benchmarks/serving.py --proxy-floor``).
"""

from __future__ import annotations

import asyncio
import sys


class _Upstream(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.upstream: asyncio.Transport | None = None
        self.early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]  # uvloop's: not subclasses
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        client = self.transport
        self.upstream, _ = await loop.create_connection(
            lambda: _Upstream(client),
            "127.0.0.1",
            self.upstream_port,
        )
        for data in self.early:
            self.upstream.write(data)
        self.early.clear()

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.early.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def _serve(port: int, upstream_port: int) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: _Client(upstream_port), "127.0.0.1", port)
    await server.serve_forever()


def main(argv: list[str]) -> int:
    port, upstream_port = int(argv[0]), int(argv[1])
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with the serve extra
        asyncio.run(_serve(port, upstream_port))
    else:
        uvloop.run(_serve(port, upstream_port))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
