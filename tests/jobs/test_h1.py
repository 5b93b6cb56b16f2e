"""daemon/net/h1.py: one HTTP/1.1 connection, one request at a time, against a raw loopback
server that answers each request head it reads with the next scripted answer."""

from __future__ import annotations

import httpcore
import pytest
import trio

from daemon.net.coalesce import CoalescingBackend
from daemon.net.h1 import H1Connection

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"


class Raw:
    """A loopback server: `answers` in order, one per request; what it read, per connection."""

    def __init__(self, answers: list[bytes], close_after: bool = False) -> None:
        self.answers = answers
        self.close_after = close_after
        self.received: list[bytes] = []
        self.connections = 0
        self.closed = trio.Event()
        self.port = 0

    async def handler(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        data = b""
        try:
            while self.answers:
                while b"\r\n\r\n" not in data:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    data += chunk
                head, data = data.split(b"\r\n\r\n", 1)
                length = next(
                    (int(v) for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n"))
                     if k.lower() == b"content-length"), 0
                )  # fmt: skip
                while len(data) < length:
                    data += await stream.receive_some(65536)
                self.received.append(head + b"\r\n\r\n" + data[:length])
                data = data[length:]
                await stream.send_all(self.answers.pop(0))
                if self.close_after:
                    return
        finally:
            await stream.aclose()
            self.closed.set()


async def started(nursery: trio.Nursery, answers: list[bytes], close_after: bool = False) -> Raw:
    raw = Raw(answers, close_after)
    listeners = await nursery.start(trio.serve_tcp, raw.handler, 0)
    raw.port = listeners[0].socket.getsockname()[1]
    return raw


def connection(raw: Raw, keepalive: float = 5.0) -> H1Connection:
    origin = httpcore.Origin(b"http", b"127.0.0.1", raw.port)
    return H1Connection(
        origin, ssl_context=None, keepalive_expiry=keepalive, network_backend=CoalescingBackend()
    )


def get(raw: Raw, path: bytes = b"/", body: bytes | None = None) -> httpcore.Request:
    url = httpcore.URL(scheme=b"http", host=b"127.0.0.1", port=raw.port, target=path)
    headers = [(b"Host", b"site.test")]
    if body is not None:
        headers.append((b"Content-Length", str(len(body)).encode()))
    timeout = {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}
    return httpcore.Request(
        b"GET" if body is None else b"POST", url, headers=headers, content=body,
        extensions={"timeout": timeout},
    )  # fmt: skip


async def read(response: httpcore.Response) -> bytes:
    body = b"".join([chunk async for chunk in response.aiter_stream()])
    await response.aclose()
    return body


async def test_an_answer_read_to_the_end_keeps_the_connection(nursery: trio.Nursery) -> None:
    raw = await started(nursery, [OK, OK, OK])  # the server keeps the connection open
    conn = connection(raw)
    for path in (b"/a", b"/b?x=1"):
        response = await conn.handle_async_request(get(raw, path))
        assert (response.status, await read(response)) == (200, b"hello")
        assert conn.is_idle() and not conn.has_expired()
    assert raw.connections == 1
    assert raw.received == [
        b"GET /a HTTP/1.1\r\nHost: site.test\r\n\r\n",
        b"GET /b?x=1 HTTP/1.1\r\nHost: site.test\r\n\r\n",
    ]
    await conn.aclose()


async def test_a_body_goes_out_with_its_head(nursery: trio.Nursery) -> None:
    raw = await started(nursery, [OK])
    conn = connection(raw)
    response = await conn.handle_async_request(get(raw, b"/in", body=b'{"a":1}'))
    assert await read(response) == b"hello"
    assert raw.received == [
        b'POST /in HTTP/1.1\r\nHost: site.test\r\nContent-Length: 7\r\n\r\n{"a":1}'
    ]
    await conn.aclose()


async def test_an_answer_not_read_to_the_end_closes_the_connection(nursery: trio.Nursery) -> None:
    raw = await started(nursery, [b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhel"])
    conn = connection(raw)
    response = await conn.handle_async_request(get(raw))
    assert response.status == 200
    await response.aclose()
    assert not conn.is_idle()
    with pytest.raises(httpcore.ConnectionNotAvailable):
        await conn.handle_async_request(get(raw))


async def test_one_request_at_a_time(nursery: trio.Nursery) -> None:
    raw = await started(nursery, [OK])
    conn = connection(raw)
    response = await conn.handle_async_request(get(raw))
    with pytest.raises(httpcore.ConnectionNotAvailable):
        await conn.handle_async_request(get(raw))
    assert await read(response) == b"hello"
    await conn.aclose()


async def test_a_connection_the_server_closed_has_expired(nursery: trio.Nursery) -> None:
    raw = await started(nursery, [OK], close_after=True)
    conn = connection(raw)
    assert await read(await conn.handle_async_request(get(raw))) == b"hello"
    await raw.closed.wait()
    assert conn.is_idle() and conn.has_expired()
    await conn.aclose()


async def test_a_connection_past_its_keepalive_has_expired(nursery: trio.Nursery) -> None:
    raw = await started(nursery, [OK])
    conn = connection(raw, keepalive=-1.0)
    assert await read(await conn.handle_async_request(get(raw))) == b"hello"
    assert conn.has_expired()
    await conn.aclose()


async def test_no_answer_is_a_protocol_error(nursery: trio.Nursery) -> None:
    raw = await started(nursery, [b""], close_after=True)
    conn = connection(raw)
    with pytest.raises(httpcore.RemoteProtocolError, match="without sending a response"):
        await conn.handle_async_request(get(raw))
    assert not conn.is_idle()


async def test_a_malformed_answer_is_a_protocol_error(nursery: trio.Nursery) -> None:
    raw = await started(nursery, [b"HTTP/1.1 2x0 OK\r\n\r\n"])
    conn = connection(raw)
    with pytest.raises(httpcore.RemoteProtocolError):
        await conn.handle_async_request(get(raw))


async def test_a_refused_connection_is_a_connect_error() -> None:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    raw = Raw([])
    raw.port = port
    with pytest.raises(httpcore.ConnectError):
        await connection(raw).handle_async_request(get(raw))


async def test_a_header_h11_refuses_is_a_local_error_each_time(nursery: trio.Nursery) -> None:
    raw = await started(nursery, [OK])
    for _ in range(2):  # the refused head is not remembered as checked
        bad = get(raw)
        bad.headers.append((b"X-Bad", b"a\r\nInjected: 1"))
        with pytest.raises(httpcore.LocalProtocolError):
            await connection(raw).handle_async_request(bad)
    assert raw.received == []
