# A request's head and body in one send: an httpcore network backend whose streams hold writes
# until the next read.
#
# httpcore's HTTP/1.1 connection writes a request as two socket sends (the head, then the body).
# Profiling the webhook bench on a loaded 2-core box put each of those sends at about 200 us of
# the trio thread's CPU (on loopback the kernel runs the receiver's side of TCP inside the
# sender's send, and wakes the receiver for each segment), a third of the daemon's own CPU per
# event. A webhook request is small and its sender reads the answer right after writing, so
# the writes wait for that read (or a TLS upgrade) and leave in one send: the same bytes, in the
# same order, before anything is read.
#
# httpcore ignores a failed write and goes on to read the answer (a server may refuse a request
# early with a well-formed error); a write failing when it is sent here, at the read, is ignored
# the same way. A write's timeout becomes the send's.
from __future__ import annotations

import contextlib
import ssl
import typing

import httpcore


class CoalescingStream(httpcore.AsyncNetworkStream):
    """`stream`, with writes held until the next read, TLS upgrade or close."""

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self._held: list[bytes] = []
        self._timeout: float | None = None
        self.sends = 0
        """Sends made (tests)."""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer:
            self._held.append(buffer)
            self._timeout = timeout

    async def _send(self) -> None:
        if self._held:
            data = b"".join(self._held)
            self._held.clear()
            self.sends += 1
            await self._stream.write(data, self._timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        with contextlib.suppress(httpcore.WriteError):  # as httpcore: the answer may be there
            await self._send()
        return await self._stream.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._held.clear()
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        await self._send()
        return CoalescingStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._stream.get_extra_info(info)


class CoalescingBackend(httpcore.AsyncNetworkBackend):
    """httpcore's trio backend, its streams wrapped in `CoalescingStream`."""

    def __init__(self) -> None:
        self._backend = httpcore.TrioBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._backend.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )
        return CoalescingStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._backend.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options
        )
        return CoalescingStream(stream)

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)
