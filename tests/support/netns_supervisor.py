"""Inside the emulated pod network (see tests/support/kube.py): start the processes, forward ports, stop on SIGTERM.

``python -m tests.support.netns_supervisor SPEC.json``.

- It restarts a process that exits, with back-off, as the kubelet would, and counts restarts in
  ``<workdir>/restarts.json``.
- For every port in ``forward`` it listens on the Unix socket ``<workdir>/sock/<port>.sock`` and pipes each
  connection to ``127.0.0.1:<port>`` inside the namespace, so the test process outside can reach it (as
  ``kubectl port-forward`` would).
- It stands in for the Collector's OTLP/HTTP receiver on ``otlp_sink_port``: it answers every POST with 200
  and counts trace exports in ``<workdir>/otlp-exports``.
- It answers DNS on 127.0.0.1:53 (UDP) for ``dns_names``, as Docker's embedded DNS server does for service
  names: an A record of 127.0.0.1 for each, NXDOMAIN for any other name. Programs that read ``/etc/hosts``
  need no DNS, but Prometheus's ``dns_sd_configs`` asks a DNS server directly.
- It writes ``<workdir>/sock/ready`` once everything listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def _forwarder(port: int) -> Any:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return handle


async def _otlp_sink(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counter: Path, counts: dict[str, int]
) -> None:
    """Minimal HTTP/1.1: read one request per connection loop, answer 200 with an empty protobuf body."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = 0
            for line in lines[1:]:
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            await reader.readexactly(length)
            if lines[0].startswith("POST /v1/traces"):
                counts["traces"] += 1
                await asyncio.to_thread(counter.write_text, str(counts["traces"]))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
        pass
    finally:
        writer.close()


class _Dns(asyncio.DatagramProtocol):
    """Just enough DNS (RFC 1035) for A queries of known names."""

    def __init__(self, names: set[str]) -> None:
        self.names = {n.lower().rstrip(".") for n in names}
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            reply = self.answer(data)
        except (IndexError, ValueError):
            return  # not a query we understand: no answer, the client retries or gives up
        self.transport.sendto(reply, addr)

    def answer(self, query: bytes) -> bytes:
        ident, flags = struct.unpack("!HH", query[:4])
        labels, i = [], 12
        while query[i]:
            labels.append(query[i + 1 : i + 1 + query[i]].decode("ascii"))
            i += 1 + query[i]
        qtype, _qclass = struct.unpack("!HH", query[i + 1 : i + 5])
        question = query[12 : i + 5]
        name = ".".join(labels).lower()
        known = name in self.names
        rcode = 0 if known else 3
        answers = b""
        if known and qtype == 1:  # A
            answers = struct.pack("!HHHIH", 0xC00C, 1, 1, 5, 4) + bytes([127, 0, 0, 1])
        # QR, the query's opcode and RD, AA, RA, the rcode.
        reply_flags = 0x8000 | (flags & 0x7900) | 0x0400 | 0x0080 | rcode
        header = struct.pack("!HHHHHH", ident, reply_flags, 1, 1 if answers else 0, 0, 0)
        return header + question + answers


async def main(spec: dict[str, Any]) -> int:
    workdir = Path(spec["workdir"])
    logs = workdir / "logs"
    children: list[subprocess.Popen[bytes]] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    servers = []
    counter, counts = workdir / "otlp-exports", {"traces": 0}
    servers.append(
        await asyncio.start_server(lambda r, w: _otlp_sink(r, w, counter, counts), "127.0.0.1", spec["otlp_sink_port"])
    )

    def start(p: dict[str, Any]) -> subprocess.Popen[bytes]:
        log = (logs / f"{p['name']}.log").open("ab")
        env = {**spec["base_env"], **p["env"]}
        return subprocess.Popen(
            p["argv"], env=env, cwd=p["cwd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    if spec.get("dns_names"):
        await loop.create_datagram_endpoint(lambda: _Dns(set(spec["dns_names"])), local_addr=("127.0.0.1", 53))
    for p in spec["processes"]:
        children.append(start(p))
    restarts = {p["name"]: 0 for p in spec["processes"]}

    async def restart_exited() -> None:
        # restartPolicy: Always, with the kubelet's doubling back-off (here capped at 8 s, not 5 min).
        next_start: dict[int, float] = {}
        while not stop.is_set():
            await asyncio.sleep(0.5)
            for i, p in enumerate(spec["processes"]):
                rc = children[i].poll()
                if rc is None or stop.is_set():
                    continue
                now = loop.time()
                if i not in next_start:
                    delay = min(8.0, 2.0 ** restarts[p["name"]])
                    next_start[i] = now + delay
                    with (logs / f"{p['name']}.log").open("a") as log:
                        log.write(f"[supervisor] exited with {rc}; restarting in {delay:g} s\n")
                elif now >= next_start[i]:
                    del next_start[i]
                    restarts[p["name"]] += 1
                    (workdir / "restarts.json").write_text(json.dumps(restarts))
                    children[i] = start(p)

    restarter = asyncio.create_task(restart_exited())
    for port in spec["forward"]:
        path = workdir / "sock" / f"{port}.sock"
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        servers.append(await asyncio.start_unix_server(_forwarder(port), path=str(path)))
    (workdir / "sock" / "ready").write_text(json.dumps({"pids": [c.pid for c in children]}))
    await stop.wait()
    restarter.cancel()
    for server in servers:
        server.close()
    for child in children:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
    for child in children:
        try:
            await asyncio.to_thread(child.wait, 10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(json.loads(Path(sys.argv[1]).read_text()))))
