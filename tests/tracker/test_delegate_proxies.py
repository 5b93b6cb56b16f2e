"""HTTP and SOCKS5 proxies carry real requests to the simulator (minimal proxies on 127.0.0.1)."""

from __future__ import annotations

import base64
import contextlib
import functools
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

import httpx
import pytest
import trio
import trio.testing

from daemon.clock import trio_epoch_clock
from daemon.fakes.bilibili import BilibiliSim, serve_sim
from daemon.tracker.bilibili import BiliClient, UpstreamError
from daemon.tracker.config import ProxyConfig
from daemon.tracker.delegate import NetworkDelegate

START_MS = 1_750_000_000_000


class Reader:
    """Exact-size reads from a trio stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = b""

    async def exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    async def until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        out, _, self.buffer = self.buffer.partition(marker)
        return out


async def pipe(source: trio.abc.Stream, sink: trio.abc.Stream, first: bytes = b"") -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        if first:
            await sink.send_all(first)
        async for chunk in source:
            await sink.send_all(chunk)


async def splice(client: trio.abc.Stream, upstream: trio.abc.Stream, leftover: bytes) -> None:
    async with trio.open_nursery() as nursery:

        async def one_way(a: trio.abc.Stream, b: trio.abc.Stream, first: bytes = b"") -> None:
            await pipe(a, b, first)
            nursery.cancel_scope.cancel()

        nursery.start_soon(one_way, client, upstream, leftover)
        nursery.start_soon(one_way, upstream, client)


class ProxyLog:
    def __init__(self) -> None:
        self.credentials: list[str | None] = []
        self.targets: list[str] = []


def http_proxy(log: ProxyLog) -> Callable[[trio.SocketStream], Awaitable[None]]:
    """A forward proxy for http:// targets (absolute-form request lines)."""

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            reader = Reader(stream)
            head = (await reader.until(b"\r\n\r\n")).decode()
            request_line, *lines = head.split("\r\n")
            method, target, version = request_line.split(" ")
            auth = next(
                (v.strip() for k, _, v in (h.partition(":") for h in lines)
                 if k.lower() == "proxy-authorization"),
                None,
            )  # fmt: skip
            log.credentials.append(
                base64.b64decode(auth.split()[1]).decode() if auth is not None else None
            )
            log.targets.append(target)
            url = urlsplit(target)
            kept = [h for h in lines if not h.lower().startswith(("proxy-", "connection:"))]
            path = url.path + (f"?{url.query}" if url.query else "")
            upstream = await trio.open_tcp_stream(url.hostname or "", url.port or 80)
            async with upstream:
                forwarded = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close"])
                await upstream.send_all(forwarded.encode() + b"\r\n\r\n" + reader.buffer)
                await pipe(upstream, stream)

    return handle


def socks5_proxy(log: ProxyLog) -> Callable[[trio.SocketStream], Awaitable[None]]:
    """A SOCKS5 proxy (RFC 1928 CONNECT, RFC 1929 username/password)."""

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            reader = Reader(stream)
            _, count = await reader.exactly(2)
            methods = await reader.exactly(count)
            if 2 in methods:
                await stream.send_all(b"\x05\x02")
                _, size = await reader.exactly(2)
                user = (await reader.exactly(size)).decode()
                (size,) = await reader.exactly(1)
                password = (await reader.exactly(size)).decode()
                log.credentials.append(f"{user}:{password}")
                await stream.send_all(b"\x01\x00")
            else:
                log.credentials.append(None)
                await stream.send_all(b"\x05\x00")
            _, command, _, kind = await reader.exactly(4)
            assert command == 1
            if kind == 1:
                host = socket.inet_ntoa(await reader.exactly(4))
            else:
                (size,) = await reader.exactly(1)
                host = (await reader.exactly(size)).decode()
            port = int.from_bytes(await reader.exactly(2), "big")
            log.targets.append(f"{host}:{port}")
            upstream = await trio.open_tcp_stream(host, port)
            async with upstream:
                await stream.send_all(b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00")
                await splice(stream, upstream, reader.buffer)

    return handle


@contextlib.asynccontextmanager
async def running(
    handler: Callable[[trio.SocketStream], Awaitable[None]],
) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
        )
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("kind", "scheme", "make"), [("http", "http", http_proxy), ("socks5", "socks5", socks5_proxy)]
)
async def test_requests_go_through_the_proxy(
    kind: str,
    scheme: str,
    make: Callable[[ProxyLog], Callable[[trio.SocketStream], Awaitable[None]]],
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = trio_epoch_clock(START_MS)
    sim = BilibiliSim(clock)
    (aid,) = sim.publish(1)
    log = ProxyLog()
    async with trio.open_nursery() as nursery, running(make(log)) as proxy_port:
        shutdown = trio.Event()
        host, port = await nursery.start(
            functools.partial(serve_sim, sim, "127.0.0.1:0", shutdown=shutdown)
        )
        base = f"http://{host}:{port}"
        config = ProxyConfig(
            name="via", kind=kind, url=f"{scheme}://crawld:s3cret@127.0.0.1:{proxy_port}"
        )  # type: ignore[arg-type]
        async with httpx.AsyncClient() as http:
            delegate = NetworkDelegate([config], clock=clock, http=http)
            delegate.assume_idle()
            client = BiliClient(delegate, base)
            got = await client.view_stat(aid)
            assert got.proxy == "via" and got.value.views == 0
            assert aid in (await client.bulk_stats([aid])).value
            assert "s3cret" not in str(delegate.status())
            await delegate.aclose()
        shutdown.set()
    # every connection authenticated (a kept-alive one carries both requests)
    assert log.credentials and set(log.credentials) == {"crawld:s3cret"}
    assert all(str(port) in target for target in log.targets)
    assert sim.requests == {"view": 1, "bulk": 1}


async def test_an_unreachable_proxy_is_an_upstream_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for kind, scheme in (("http", "http"), ("socks5", "socks5")):
        config = ProxyConfig(name="down", kind=kind, url=f"{scheme}://127.0.0.1:{port}")  # type: ignore[arg-type]
        delegate = NetworkDelegate([config], clock=trio_epoch_clock(START_MS))
        delegate.assume_idle()
        with pytest.raises(UpstreamError) as caught:
            await delegate.request("http://127.0.0.1:9/x/web-interface/view?aid=1", "snapshot")
        assert caught.value.proxy == "down" and caught.value.status is None
        await delegate.aclose()
