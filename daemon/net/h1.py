# One HTTP/1.1 connection for one request at a time, as httpcore's connection does it, less what
# only a shared pool needs: the crawl's fetcher sends every page through these (daemon/net/
# origins.py hands each idle connection to a single request, the crawl's fetch slots and host
# gate bound what is in flight).
#
# httpcore's AsyncHTTPConnection takes a trio Lock when a request starts, and its HTTP/1.1
# connection two more (at the start and when the answer is closed): each acquire ends in a
# checkpoint that goes through trio's scheduler, three a page, guarding a connection only one task
# ever holds here. Around them it opens a tracing context for every step. Profiled on
# scripts/bench_crawl.py, that was about a tenth of a page's CPU on the event loop.
#
# What stays httpcore's: the network backend (connect, TLS with the request's `sni_hostname` as
# server name and the certificate checked against it, ALPN http/1.1, the timeouts of the request's
# `timeout` extension on every connect, read and write, and its exception types), h11 for the
# protocol, httpcore's Request and Response types, and its rules: a write error is ignored and
# the answer read (a server may refuse a request early with a well-formed answer), a connection
# whose answer was not read to the end is closed, an idle one is reusable until its keep-alive
# expires or the server closes it. No HTTP/2, no proxies, no upgrades.
from __future__ import annotations

import contextlib
import enum
import functools
import ssl
import time
from collections.abc import Iterable

import h11
import httpcore
import trio
from h11._headers import Headers as H11Headers  # no public name; the version is pinned
from httpcore._ssl import default_ssl_context  # no public name; the version is pinned

READ_NUM_BYTES = 64 * 1024
"""Bytes asked of the socket per read (httpcore's)."""
MAX_INCOMPLETE_EVENT_SIZE = 100 * 1024
"""The longest answer head h11 buffers (httpcore's)."""


@functools.lru_cache(maxsize=256)
def _checked_headers(headers: tuple[tuple[bytes, bytes], ...]) -> H11Headers:
    """`headers` as h11 checks and keeps them for a request: a crawl sends the same few heads
    thousands of times (ssrf.pinned_core_get), and h11 matches every header against its grammar
    on each request unless handed the form it made. Not cached when h11 refuses them."""
    return h11.Request(method=b"GET", target=b"/", headers=list(headers)).headers


class _State(enum.Enum):
    NEW = 0
    ACTIVE = 1
    IDLE = 2
    CLOSED = 3


class H1Connection:
    """An HTTP/1.1 connection to `origin`, opened by its first request; the methods a pool uses
    are httpcore.AsyncHTTPConnection's."""

    def __init__(
        self,
        origin: httpcore.Origin,
        *,
        ssl_context: ssl.SSLContext | None,
        keepalive_expiry: float,
        network_backend: httpcore.AsyncNetworkBackend,
    ) -> None:
        self._origin = origin
        self._ssl_context = ssl_context
        self._keepalive_expiry = keepalive_expiry
        self._backend = network_backend
        self._stream: httpcore.AsyncNetworkStream | None = None
        self._h11 = h11.Connection(
            our_role=h11.CLIENT, max_incomplete_event_size=MAX_INCOMPLETE_EVENT_SIZE
        )
        self._state = _State.NEW
        self._expire_at: float | None = None

    def can_handle_request(self, origin: httpcore.Origin) -> bool:
        return origin == self._origin

    def is_idle(self) -> bool:
        return self._state is _State.IDLE

    def has_expired(self) -> bool:
        """Past its keep-alive, or closed by the server (an idle socket that reads)."""
        if self._expire_at is not None and time.monotonic() > self._expire_at:
            return True
        return (
            self._state is _State.IDLE
            and self._stream is not None
            and bool(self._stream.get_extra_info("is_readable"))
        )

    async def aclose(self) -> None:
        self._state = _State.CLOSED
        if self._stream is not None:
            await self._stream.aclose()

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        """Send `request` and read the answer's head; its body is the response's stream, which
        must be closed (`response.aclose()`) to make the connection idle again."""
        if self._state is not _State.NEW and self._state is not _State.IDLE:
            raise httpcore.ConnectionNotAvailable()
        self._state = _State.ACTIVE
        self._expire_at = None
        timeouts = request.extensions.get("timeout", {})
        try:
            stream = self._stream
            if stream is None:
                stream = self._stream = await self._connect(request, timeouts.get("connect"))
            with contextlib.suppress(httpcore.WriteError):  # as httpcore: an answer may be there
                await stream.write(self._request_bytes(request), timeouts.get("write"))
            read_timeout = timeouts.get("read")
            while True:
                event = await self._receive_event(read_timeout)
                if isinstance(event, h11.Response):
                    break
                if isinstance(event, h11.InformationalResponse) and event.status_code == 101:
                    break
            return httpcore.Response(
                status=event.status_code,
                headers=event.headers.raw_items(),
                content=_Body(self, read_timeout),
                extensions={
                    "http_version": b"HTTP/" + event.http_version,
                    "reason_phrase": event.reason,
                    "network_stream": stream,
                },
            )
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._response_closed()
            raise

    async def _connect(
        self, request: httpcore.Request, timeout: float | None
    ) -> httpcore.AsyncNetworkStream:
        origin = self._origin
        stream = await self._backend.connect_tcp(
            origin.host.decode("ascii"), origin.port, timeout=timeout
        )
        if origin.scheme == b"https":
            context = self._ssl_context or default_ssl_context()
            context.set_alpn_protocols(["http/1.1"])
            sni = request.extensions.get("sni_hostname") or origin.host.decode("ascii")
            stream = await stream.start_tls(context, server_hostname=sni, timeout=timeout)
        return stream

    def _request_bytes(self, request: httpcore.Request) -> bytes:
        """The request's head, body and end as h11 frames them, to be sent at once. The body
        must be bytes (httpcore's Request holds those as a stream that is also iterable)."""
        if not isinstance(request.stream, Iterable):
            raise TypeError("an H1Connection sends bodies given as bytes")
        h11_state = self._h11
        try:
            head = h11.Request(
                method=request.method,
                target=request.url.target,
                headers=_checked_headers(tuple(request.headers)),
            )
            parts = [h11_state.send(head)]
            parts += [h11_state.send(h11.Data(data=chunk)) for chunk in request.stream]
            parts.append(h11_state.send(h11.EndOfMessage()))
        except h11.LocalProtocolError as exc:
            raise httpcore.LocalProtocolError(exc) from exc
        return b"".join(p for p in parts if p)

    async def _receive_event(self, timeout: float | None) -> h11.Event | type[h11.PAUSED]:
        h11_state = self._h11
        while True:
            try:
                event = h11_state.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpcore.RemoteProtocolError(exc) from exc
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            assert self._stream is not None
            data = await self._stream.read(READ_NUM_BYTES, timeout=timeout)
            if data == b"" and h11_state.their_state == h11.SEND_RESPONSE:
                raise httpcore.RemoteProtocolError(
                    "Server disconnected without sending a response."
                )
            h11_state.receive_data(data)

    async def _response_closed(self) -> None:
        h11_state = self._h11
        if h11_state.our_state is h11.DONE and h11_state.their_state is h11.DONE:
            self._state = _State.IDLE
            h11_state.start_next_cycle()
            self._expire_at = time.monotonic() + self._keepalive_expiry
        else:
            await self.aclose()


class _Body:
    """An answer's body as an async iterator of chunks (not a generator: no trio hooks on its
    first step); closing it makes the connection idle, or closes it if the body was not read to
    the end."""

    def __init__(self, conn: H1Connection, timeout: float | None) -> None:
        self._conn = conn
        self._timeout = timeout
        self._closed = False

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        while True:
            try:
                event = await self._conn._receive_event(self._timeout)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await self.aclose()
                raise
            if isinstance(event, h11.Data):
                return bytes(event.data)
            if isinstance(event, h11.EndOfMessage) or event is h11.PAUSED:
                raise StopAsyncIteration

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._conn._response_closed()
