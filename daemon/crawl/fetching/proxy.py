# The browser's only way out. A page is untrusted code: its subresources, fetch/XHR, iframes,
# redirects, WebSockets, service workers and prefetches all open connections, and a request filter
# inside the browser misses some of them. So Chromium runs with `--proxy-server=socks5://` pointing
# here (and `<-loopback>` so loopback is not exempt), and this proxy vets every connection with the
# fetcher's SSRF guard (daemon/net/ssrf.py: `vet_url`, `allow_cidrs`) before it opens one.
#
# SOCKS5, not an HTTP proxy: Chromium sends the host *name* (it never resolves it itself; the
# host-resolver rules make sure of that), one SOCKS connection per TCP connection for every scheme
# (http, https, ws, wss), and TLS stays end to end between the page and the site, so there is no
# HTTP to parse and no certificate to forge here. The name is resolved here, the first address the
# guard accepts is the one connected to (pinned: no second resolution), and everything refused is
# counted and answered with SOCKS "not allowed", which the page sees as a failed request.
#
# The port is on loopback, so any local process could connect: connections from another user
# (looked up in /proc/net/tcp by the peer's port) are refused before the handshake, so the proxy
# is not an outbound relay for other accounts of the machine.
#
# With `[crawl] proxies` the vetted connection is not opened directly but through the configured
# upstream proxy (daemon/crawl/fetching/upstream.py: HTTP CONNECT or SOCKS5 with the vetted name),
# chosen by the same rotation as the fetcher's; `stealth_port` is a second vetting listener whose
# connections leave through the stealth pool (browser contexts of `proxy: stealth` pages).
#
# The pure parts (the SOCKS5 greeting and request, the /proc/net/tcp lookup) are separate from the
# trio server so they are tested with plain bytes and text.
from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import struct
from collections import Counter
from dataclasses import dataclass, field

import httpx
import trio

from daemon.crawl.fetching.upstream import TunnelFailed, open_tunnel
from daemon.crawl.proxies import Proxies
from daemon.logs import get_logger
from daemon.net.ssrf import (
    BlockedAddress,
    Network,
    ResolutionFailed,
    Resolver,
    parse_networks,
    vet_url,
)

log = get_logger("crawl.proxy")

__all__ = ["SocksRequest", "VettingProxy", "parse_greeting", "parse_request", "reply"]

MAX_TUNNELS = 512
HANDSHAKE_SECONDS = 10.0

REP_OK = 0
REP_FAILURE = 1
REP_NOT_ALLOWED = 2
REP_HOST_UNREACHABLE = 4
REP_REFUSED = 5
REP_COMMAND = 7
REP_ADDRESS_TYPE = 8


class SocksError(Exception):
    def __init__(self, rep: int, reason: str) -> None:
        super().__init__(reason)
        self.rep = rep
        self.reason = reason


@dataclass(frozen=True)
class SocksRequest:
    host: str
    port: int


def parse_greeting(data: bytes) -> int | None:
    """Bytes the greeting needs in all (None: need at least 2); SocksError when it is not SOCKS5
    or offers no "no authentication" method."""
    if len(data) < 2:
        return None
    if data[0] != 5:
        raise SocksError(REP_FAILURE, "not SOCKS5")
    need = 2 + data[1]
    if len(data) >= need and 0 not in data[2:need]:
        raise SocksError(REP_FAILURE, "no acceptable authentication method")
    return need


def parse_request(data: bytes) -> tuple[SocksRequest, int] | None:
    """The CONNECT request and its length, None when more bytes are needed."""
    if len(data) < 5:
        return None
    version, command, _, kind = data[0], data[1], data[2], data[3]
    if version != 5:
        raise SocksError(REP_FAILURE, "not SOCKS5")
    if command != 1:
        raise SocksError(REP_COMMAND, "only CONNECT is supported")
    if kind == 1:
        end = 4 + 4
        if len(data) < end + 2:
            return None
        host = str(ipaddress.IPv4Address(data[4:end]))
    elif kind == 4:
        end = 4 + 16
        if len(data) < end + 2:
            return None
        host = str(ipaddress.IPv6Address(data[4:end]))
    elif kind == 3:
        size = data[4]
        end = 5 + size
        if len(data) < end + 2:
            return None
        try:
            host = data[5:end].decode("ascii")
        except UnicodeDecodeError:
            raise SocksError(REP_HOST_UNREACHABLE, "host name is not ASCII") from None
        if not host:
            raise SocksError(REP_HOST_UNREACHABLE, "empty host name")
    else:
        raise SocksError(REP_ADDRESS_TYPE, "unknown address type")
    (port,) = struct.unpack("!H", data[end : end + 2])
    return SocksRequest(host, port), end + 2


def reply(rep: int) -> bytes:
    """A SOCKS5 reply (bound address 0.0.0.0:0: Chromium does not read it)."""
    return bytes([5, rep, 0, 1, 0, 0, 0, 0, 0, 0])


def _hex_endpoint(ip: str, port: int) -> str:
    """An IPv4 endpoint as /proc/net/tcp writes it (address in host byte order, little endian
    on every Linux this runs on)."""
    packed = ipaddress.IPv4Address(ip).packed
    return f"{int.from_bytes(packed, 'little'):08X}:{port:04X}"


def socket_owner(table: str, local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The uid owning the TCP socket `local` -> `remote` in /proc/net/tcp text, or None."""
    want_local, want_remote = _hex_endpoint(*local), _hex_endpoint(*remote)
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 7 and fields[1] == want_local and fields[2] == want_remote:
            return int(fields[7])
    return None


def _peer_uid(peer: tuple[str, int], server: tuple[str, int]) -> int | None:
    try:
        with open("/proc/net/tcp") as file:
            return socket_owner(file.read(), peer, server)
    except OSError:
        return None


def _url_for(request: SocksRequest) -> httpx.URL:
    return httpx.URL(scheme="http", host=request.host, port=request.port, path="/")


@dataclass
class VettingProxy:
    """SOCKS5 on 127.0.0.1 (ephemeral ports) for the browser, once `run` started: `port` vets
    and connects (the browser contexts pages run in use it), `closed_port` refuses everything
    without even resolving the name (the browser's own default, so its background services -
    update checks, sign-in, autofill - send nothing anywhere)."""

    allow_cidrs: tuple[str, ...] = ()
    resolver: Resolver | None = None
    connect_timeout: float = 10.0
    port: int = 0
    closed_port: int = 0
    stealth_port: int = 0
    upstream: Proxies | None = None
    """The configured outbound proxies (None or inactive: connect directly)."""
    counts: Counter[str] = field(default_factory=Counter)
    refused: list[str] = field(default_factory=list)
    """The last refused destinations (host:port and why), newest last, for tests and /status."""

    def __post_init__(self) -> None:
        self._allow: list[Network] = parse_networks(self.allow_cidrs)
        self._limit = trio.CapacityLimiter(MAX_TUNNELS)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        closed = await trio.open_tcp_listeners(0, host="127.0.0.1")
        stealth = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        self.closed_port = closed[0].socket.getsockname()[1]
        self.stealth_port = stealth[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._serve_closed, closed)
            nursery.start_soon(
                trio.serve_listeners, functools.partial(self._serve, pool="stealth"), stealth
            )
            task_status.started(self.port)
            await trio.serve_listeners(self._serve, listeners, handler_nursery=nursery)

    async def _serve_closed(self, stream: trio.SocketStream) -> None:
        async with stream:
            if self._foreign(stream):
                return
            self.counts["browser_own"] += 1
            with trio.move_on_after(HANDSHAKE_SECONDS):
                data = b""
                try:
                    while (need := parse_greeting(data)) is None or len(data) < need:
                        chunk = await stream.receive_some(512)
                        if not chunk:
                            return
                        data += chunk
                    await stream.send_all(b"\x05\x00")
                    data = data[need:]
                    while parse_request(data) is None:
                        chunk = await stream.receive_some(512)
                        if not chunk:
                            return
                        data += chunk
                except SocksError:
                    pass
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return
                await _send_quietly(stream, reply(REP_NOT_ALLOWED))

    def _foreign(self, stream: trio.SocketStream) -> bool:
        """A connection from a process of another user (or one that cannot be identified)."""
        peer = stream.socket.getpeername()
        server = stream.socket.getsockname()
        uid = _peer_uid((peer[0], peer[1]), (server[0], server[1]))
        if uid == os.geteuid():
            return False
        self.counts["foreign"] += 1
        log.warning("proxy connection from another user refused", uid=uid)
        return True

    async def _serve(self, stream: trio.SocketStream, pool: str = "basic") -> None:
        async with stream:
            if self._foreign(stream):
                return
            if self._limit.available_tokens == 0:
                self.counts["busy"] += 1
            async with self._limit:
                try:
                    upstream = await self._handshake(stream, pool)
                except SocksError as exc:
                    self.counts["refused"] += 1
                    await _send_quietly(stream, reply(exc.rep))
                    return
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return
                if upstream is None:
                    return
                async with upstream:
                    self.counts["tunnels"] += 1
                    await _pipe(stream, upstream)

    async def _handshake(self, stream: trio.SocketStream, pool: str) -> trio.abc.Stream | None:
        data = b""
        with trio.move_on_after(HANDSHAKE_SECONDS):
            while (need := parse_greeting(data)) is None or len(data) < need:
                chunk = await stream.receive_some(512)
                if not chunk:
                    return None
                data += chunk
            await stream.send_all(b"\x05\x00")
            data = data[need:]
            while (parsed := parse_request(data)) is None:
                chunk = await stream.receive_some(512)
                if not chunk:
                    return None
                data += chunk
            request, _ = parsed
            upstream = await self._connect(request, pool)
            await stream.send_all(reply(REP_OK))
            return upstream
        return None

    def _refuse(self, request: SocksRequest, rep: int, reason: str) -> SocksError:
        where = f"{request.host}:{request.port}"
        self.refused.append(f"{where} {reason}")
        del self.refused[:-100]
        log.info("browser connection refused", target=where, reason=reason)
        return SocksError(rep, reason)

    async def _connect(self, request: SocksRequest, pool: str = "basic") -> trio.abc.Stream:
        if request.port == 0:
            raise self._refuse(request, REP_NOT_ALLOWED, "port 0")
        try:
            vetted = await vet_url(_url_for(request), self._allow, resolver=self.resolver)
        except ResolutionFailed as exc:
            raise self._refuse(request, REP_HOST_UNREACHABLE, exc.reason) from None
        except BlockedAddress as exc:
            raise self._refuse(request, REP_NOT_ALLOWED, exc.reason) from None
        own = (self.port, self.stealth_port, self.closed_port)
        if vetted.port in own and ipaddress.ip_address(vetted.ip).is_loopback:
            raise self._refuse(request, REP_NOT_ALLOWED, "the proxy itself")
        chosen = self.upstream.pick(pool, vetted.host) if self.upstream is not None else None
        if chosen is not None:
            assert self.upstream is not None
            # The vetted name (not the address) goes to the proxy, which resolves it again.
            try:
                with trio.fail_after(self.connect_timeout):
                    tunnel = await open_tunnel(chosen, request.host, request.port)
            except (TunnelFailed, trio.TooSlowError) as exc:
                self.counts["connect_failed"] += 1
                self.upstream.count(chosen, "SCRAPE_SITE_ERROR")
                reason = exc.reason if isinstance(exc, TunnelFailed) else "timed out"
                log.info("browser connection through proxy failed", proxy=chosen.name,
                         reason=reason)  # fmt: skip
                raise SocksError(REP_REFUSED, reason) from None
            self.upstream.count(chosen, "ok")
            return tunnel
        try:
            with trio.fail_after(self.connect_timeout):
                return await trio.open_tcp_stream(vetted.ip, vetted.port)
        except (OSError, trio.TooSlowError) as exc:
            self.counts["connect_failed"] += 1
            raise SocksError(REP_REFUSED, f"cannot connect: {exc}") from None


async def _send_quietly(stream: trio.SocketStream, data: bytes) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await stream.send_all(data)


async def _pipe(a: trio.abc.Stream, b: trio.abc.Stream) -> None:
    async def copy(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
        try:
            while chunk := await source.receive_some(1 << 16):
                await sink.send_all(chunk)
            if isinstance(sink, trio.abc.HalfCloseableStream):
                await sink.send_eof()
            else:
                nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(copy, a, b)
        nursery.start_soon(copy, b, a)
