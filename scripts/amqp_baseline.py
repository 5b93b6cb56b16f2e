"""Raw publishing baselines for bench_collector.py, run in a process of their own.

This file imports nothing from `daemon` (importing a module that imports trio_asyncio would swap
asyncio's loop factory and make "plain asyncio" a trio-asyncio loop), and it checks that: the aiormq
baseline asserts it runs on a stock `asyncio.SelectorEventLoop`.

Modes (the message bodies come from a file of JSON strings, one message per body):
- `aiormq`: what a competent engineer writes with aiormq on plain asyncio: `window` publishes
  (persistent, mandatory, expiration, message_id, timestamp, app_id, 3 headers) gathered
  concurrently, every confirm awaited, then the next window.
- `pamqp`: a blocking-socket publisher that writes a whole window of pre-marshalled pamqp frames
  with one `sendall` and reads confirms until the window's last delivery tag is acked: RabbitMQ's
  own ceiling on this machine, with the same confirm rule and message properties.

Prints one JSON object: {"mode", "rows", "seconds", "cpu_seconds", "rows_per_s", "loop"}; the
seconds (wall and CPU) are those of the publishing alone, after connect and declare.
Usage: python scripts/amqp_baseline.py MODE URL QUEUE BODIES_FILE WINDOW
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
import uuid
from datetime import UTC, datetime
from urllib.parse import unquote, urlsplit

import aiormq
from pamqp import body as pbody
from pamqp import commands, frame, header
from pamqp import heartbeat as pheartbeat


def properties(i: int, first: int, now: datetime) -> commands.Basic.Properties:
    return commands.Basic.Properties(
        content_type="application/json",
        delivery_mode=2,
        message_id=uuid.uuid4().hex,
        expiration="604800000",
        timestamp=now,
        app_id="crawld",
        headers={"task_id": "t0", "run_id": "r", "offset": first},
    )


async def aiormq_publish(
    url: str, queue: str, bodies: list[bytes], window: int
) -> tuple[str, float, float]:
    loop = asyncio.get_running_loop()
    assert type(loop) is asyncio.SelectorEventLoop, f"not a plain asyncio loop: {type(loop)}"
    assert not any(m == "trio_asyncio" or m.startswith("daemon") for m in sys.modules)
    connection = await aiormq.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "classic"})
    now = datetime.now(UTC).replace(microsecond=0)
    start, cpu = time.perf_counter(), time.process_time()
    for first in range(0, len(bodies), window):
        results = await asyncio.gather(
            *(
                channel.basic_publish(
                    body,
                    routing_key=queue,
                    mandatory=True,
                    properties=properties(i, first, now),
                )
                for i, body in enumerate(bodies[first : first + window], start=first)
            )
        )
        assert all(isinstance(r, commands.Basic.Ack) for r in results)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    await channel.queue_delete(queue)
    await connection.close()
    return f"{type(loop).__module__}.{type(loop).__qualname__}", elapsed, cpu


class BlockingPublisher:
    """AMQP 0-9-1 over a blocking socket with pamqp frames: just enough for confirmed publishes."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        self.sock.sendall(frame.marshal(header.ProtocolHeader(), 0))
        self.expect(commands.Connection.Start)
        user, password = unquote(parts.username or "guest"), unquote(parts.password or "guest")
        self.send(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "baseline"},
                mechanism="PLAIN",
                response=f"\0{user}\0{password}",
                locale="en_US",
            ),
        )
        tune = self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max
        self.send(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        self.send(0, commands.Connection.Open(virtual_host=vhost))
        self.expect(commands.Connection.OpenOk)
        self.send(1, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)
        self.send(1, commands.Confirm.Select())
        self.expect(commands.Confirm.SelectOk)

    def send(self, channel: int, value: commands.Frame) -> None:  # type: ignore[name-defined]
        self.sock.sendall(frame.marshal(value, channel))

    def receive(self) -> object:
        while True:
            if self.buffer:
                try:
                    used, _, value = frame.unmarshal(self.buffer)
                except Exception:  # an incomplete frame: read more
                    used = 0
                if used:
                    self.buffer = self.buffer[used:]
                    if not isinstance(value, pheartbeat.Heartbeat):
                        return value
                    continue
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the broker closed the connection")
            self.buffer += data

    def expect(self, kind: type) -> object:
        value = self.receive()
        if not isinstance(value, kind):
            raise RuntimeError(f"expected {kind.__name__}, got {value!r}")
        return value

    def publish_window(self, queue: str, bodies: list[bytes], first: int, now: datetime) -> None:
        out = bytearray()
        for i, data in enumerate(bodies, start=first):
            out += frame.marshal(commands.Basic.Publish(routing_key=queue, mandatory=True), 1)
            out += frame.marshal(header.ContentHeader(0, len(data), properties(i, first, now)), 1)
            out += frame.marshal(pbody.ContentBody(data), 1)
        self.sock.sendall(out)
        self.tag += len(bodies)
        while self.acked < self.tag:
            value = self.receive()
            if isinstance(value, commands.Basic.Ack):
                self.acked = value.delivery_tag if value.multiple else self.acked + 1
            else:
                raise RuntimeError(f"unexpected frame while waiting for confirms: {value!r}")

    tag = 0
    acked = 0


def pamqp_publish(
    url: str, queue: str, bodies: list[bytes], window: int
) -> tuple[str, float, float]:
    publisher = BlockingPublisher(url)
    publisher.send(1, commands.Queue.Declare(queue=queue, durable=True))
    publisher.expect(commands.Queue.DeclareOk)
    now = datetime.now(UTC).replace(microsecond=0)
    start, cpu = time.perf_counter(), time.process_time()
    for first in range(0, len(bodies), window):
        publisher.publish_window(queue, bodies[first : first + window], first, now)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    publisher.send(1, commands.Queue.Delete(queue=queue))
    publisher.expect(commands.Queue.DeleteOk)
    publisher.sock.close()
    return "blocking socket", elapsed, cpu


def main() -> None:
    mode, url, queue, path, window = sys.argv[1:6]
    with open(path, "rb") as file:
        bodies = [body.encode() for body in json.load(file)]
    if mode == "aiormq":
        loop, wall, cpu = asyncio.run(aiormq_publish(url, queue, bodies, int(window)))
    elif mode == "pamqp":
        loop, wall, cpu = pamqp_publish(url, queue, bodies, int(window))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(
        json.dumps(
            {
                "mode": mode,
                "rows": len(bodies),
                "seconds": wall,
                "cpu_seconds": cpu,
                "rows_per_s": len(bodies) / wall,
                "loop": loop,
            }
        )
    )


if __name__ == "__main__":
    main()
