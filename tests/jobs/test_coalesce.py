"""CoalescingStream: a request's writes leave in one send, at the next read, in order."""

from __future__ import annotations

import ssl
from typing import Any

import httpcore
import pytest

from daemon.fakes.receiver import WebhookReceiver
from daemon.net.coalesce import CoalescingStream
from daemon.net.ssrf import new_transport, parse_networks, send_vetted

LOOPBACK = parse_networks(["127.0.0.0/8"])


class Recorder(httpcore.AsyncNetworkStream):
    def __init__(self, fail_writes: bool = False) -> None:
        self.log: list[tuple[str, Any]] = []
        self.fail_writes = fail_writes

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.log.append(("write", (buffer, timeout)))
        if self.fail_writes:
            raise httpcore.WriteError("peer closed")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self.log.append(("read", max_bytes))
        return b"HTTP/1.1 200 OK\r\n"

    async def aclose(self) -> None:
        self.log.append(("close", None))

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        self.log.append(("tls", server_hostname))
        return Recorder()

    def get_extra_info(self, info: str) -> Any:
        return f"info:{info}"


async def test_writes_wait_for_the_read_and_leave_as_one_send() -> None:
    inner = Recorder()
    stream = CoalescingStream(inner)
    await stream.write(b"POST / HTTP/1.1\r\n\r\n", 5.0)
    await stream.write(b"")
    await stream.write(b'{"x":1}', 5.0)
    assert inner.log == []
    assert await stream.read(100, 2.0) == b"HTTP/1.1 200 OK\r\n"
    assert inner.log == [("write", (b'POST / HTTP/1.1\r\n\r\n{"x":1}', 5.0)), ("read", 100)]
    await stream.read(10)  # nothing held: no send
    assert [kind for kind, _ in inner.log] == ["write", "read", "read"]
    assert stream.sends == 1
    assert stream.get_extra_info("is_readable") == "info:is_readable"


async def test_a_failed_send_is_ignored_and_the_answer_read_as_httpcore_does() -> None:
    inner = Recorder(fail_writes=True)
    stream = CoalescingStream(inner)
    await stream.write(b"head")
    assert await stream.read(100) == b"HTTP/1.1 200 OK\r\n"
    assert [kind for kind, _ in inner.log] == ["write", "read"]


async def test_tls_upgrade_sends_what_is_held_first_and_close_drops_it() -> None:
    inner = Recorder()
    stream = CoalescingStream(inner)
    await stream.write(b"before")
    upgraded = await stream.start_tls(ssl.create_default_context(), "hooks.test")
    assert inner.log == [("write", (b"before", None)), ("tls", "hooks.test")]
    assert isinstance(upgraded, CoalescingStream)
    await upgraded.write(b"dropped")
    await upgraded.aclose()
    assert upgraded.sends == 0


@pytest.mark.parametrize("requests", [1, 3])
async def test_each_webhook_request_is_one_send(rx: WebhookReceiver, requests: int) -> None:
    async with new_transport(verify=False) as conns:
        for _ in range(requests):
            answer = await send_vetted(conns, rx.url(), b'{"n":1}', {"X-A": "1"}, LOOPBACK, 2.0)
            assert answer.status == 200
        [conn] = conns._idle
        stream = conn._connection._network_stream  # type: ignore[union-attr]
        assert isinstance(stream, CoalescingStream)
        assert stream.sends == requests
    assert [r.body for r in rx.requests] == [b'{"n":1}'] * requests
