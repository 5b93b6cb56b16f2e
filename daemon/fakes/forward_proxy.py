# A forward proxy for tests and the demo, speaking what real ones speak: HTTP CONNECT tunnels
# (https), absolute-form requests (http), and SOCKS5 CONNECT with a domain name, with optional
# Basic / RFC 1929 credentials. It records everything it carried (`carried`): the target, the
# Proxy-Authorization it got, so tests can check what crawld handed it, and that a refused
# target never reached it. Names are resolved through `hosts` only (no packet leaves the
# machine); an unknown name is answered 502 / SOCKS "host unreachable".
#
# `block_status` makes it answer every request itself with that status (a proxy exit a site has
# banned, e.g. 403), so `proxy: auto` falling back to the stealth pool can be tested.
from __future__ import annotations

import argparse
import base64
import contextlib
import os
import ssl
import struct
import sys
from dataclasses import dataclass, field

import trio

from daemon.crawl.fetching.proxy import SocksError, parse_request

__all__ = ["Carried", "ForwardProxy", "serve_forward_proxy"]

MAX_HEAD = 64 * 1024


@dataclass(frozen=True)
class Carried:
    kind: str
    """"connect" (HTTP CONNECT), "forward" (absolute-form), "socks" (SOCKS5 CONNECT)."""
    target: str
    """host:port for connect/socks, the absolute URL for forward."""
    authorization: str | None
    """The Proxy-Authorization header (or "user:password" of SOCKS5), as received."""
    allowed: bool


@dataclass
class ForwardProxy:
    hosts: dict[str, str] = field(default_factory=dict)
    """Name -> address the proxy connects to (IP literals connect as they are)."""
    username: str | None = None
    password: str | None = None
    block_status: int | None = None
    tls: ssl.SSLContext | None = None
    """Server context: an https:// proxy (TLS to the proxy itself)."""
    carried: list[Carried] = field(default_factory=list)
    port: int = 0

    def expected(self) -> str | None:
        if self.username is None:
            return None
        raw = f"{self.username}:{self.password or ''}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")

    def _address(self, host: str) -> str | None:
        host = host.strip("[]")
        if host in self.hosts:
            return self.hosts[host]
        if host.replace(".", "").isdigit() or ":" in host:
            return host
        return None

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._serve, listeners)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, raw: trio.SocketStream) -> None:
        stream: trio.abc.Stream = raw
        if self.tls is not None:
            stream = trio.SSLStream(raw, self.tls, server_side=True)
        reader = _Reader(stream)
        async with stream:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                first = await reader.peek()
                if first[:1] == b"\x05":
                    await self._socks(reader)
                else:
                    await self._http(reader)

    # -- HTTP ------------------------------------------------------------------------------

    async def _http(self, reader: _Reader) -> None:
        while True:
            head = await reader.until(b"\r\n\r\n")
            if head is None:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = [*lines[0].split(" "), "", ""][:3]
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name:
                    headers[name.strip().lower()] = value.strip()
            auth = headers.get("proxy-authorization")
            allowed = self.username is None or auth == self.expected()
            kind = "connect" if method == "CONNECT" else "forward"
            self.carried.append(Carried(kind, target, auth, allowed))
            if not allowed:
                await reader.stream.send_all(
                    b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                    b'Proxy-Authenticate: Basic realm="test"\r\nContent-Length: 0\r\n'
                    b"Connection: close\r\n\r\n"
                )
                return
            if kind == "connect":
                await self._tunnel(reader, target)
                return
            if self.block_status is not None:
                await reader.stream.send_all(
                    f"HTTP/1.1 {self.block_status} Blocked\r\nContent-Type: text/plain\r\n"
                    f"Content-Length: 7\r\n\r\nblocked".encode()
                )
                continue
            await self._forward(reader, method, target, lines[1:])
            return

    async def _tunnel(self, reader: _Reader, target: str) -> None:
        host, _, port = target.rpartition(":")
        upstream = await self._open(host, int(port) if port.isdigit() else 0)
        if upstream is None:
            await reader.stream.send_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        async with upstream:
            await reader.stream.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if self.block_status is not None:
                return
            await _pipe(reader, upstream)

    async def _forward(self, reader: _Reader, method: str, target: str, lines: list[str]) -> None:
        rest = target.split("://", 1)[-1]
        hostport, slash, path = rest.partition("/")
        host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "80")
        upstream = await self._open(host, int(port))
        if upstream is None:
            await reader.stream.send_all(
                b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            return
        kept = [
            line
            for line in lines
            if line
            and line.split(":", 1)[0].strip().lower()
            not in ("proxy-authorization", "proxy-connection", "connection")
        ]
        request = "\r\n".join([f"{method} {slash}{path} HTTP/1.1", *kept, "Connection: close"])
        async with upstream:
            await upstream.send_all(request.encode("latin-1") + b"\r\n\r\n")
            answer = bytearray()
            while chunk := await upstream.receive_some(65536):
                answer += chunk
        head, sep, body = bytes(answer).partition(b"\r\n\r\n")
        kept_head = [
            line
            for line in head.split(b"\r\n")
            if not line.lower().startswith((b"connection:", b"keep-alive:"))
        ]
        await reader.stream.send_all(b"\r\n".join([*kept_head, b"Connection: close"]) + sep + body)

    async def _open(self, host: str, port: int) -> trio.SocketStream | None:
        address = self._address(host)
        if address is None or not port:
            return None
        try:
            return await trio.open_tcp_stream(address, port)
        except OSError:
            return None

    # -- SOCKS5 ----------------------------------------------------------------------------

    async def _socks(self, reader: _Reader) -> None:
        head = await reader.exactly(2)
        methods = await reader.exactly(head[1])
        auth: str | None = None
        if self.username is not None:
            if 2 not in methods:
                await reader.stream.send_all(b"\x05\xff")
                return
            await reader.stream.send_all(b"\x05\x02")
            version_len = await reader.exactly(2)
            user = (await reader.exactly(version_len[1])).decode()
            password = (await reader.exactly((await reader.exactly(1))[0])).decode()
            auth = f"{user}:{password}"
            ok = user == self.username and password == (self.password or "")
            await reader.stream.send_all(b"\x01\x00" if ok else b"\x01\x01")
            if not ok:
                self.carried.append(Carried("socks", "", auth, False))
                return
        else:
            await reader.stream.send_all(b"\x05\x00")
        data = b""
        while True:
            try:
                parsed = parse_request(data)
            except SocksError:
                return
            if parsed is not None:
                break
            data += await reader.exactly(1)
        request, _ = parsed
        self.carried.append(Carried("socks", f"{request.host}:{request.port}", auth, True))
        upstream = await self._open(request.host, request.port)
        if upstream is None:
            await reader.stream.send_all(b"\x05\x04\x00\x01" + bytes(4) + struct.pack("!H", 0))
            return
        async with upstream:
            await reader.stream.send_all(b"\x05\x00\x00\x01" + bytes(4) + struct.pack("!H", 0))
            await _pipe(reader, upstream)


class _Reader:
    """A stream with a read-ahead buffer (bytes read past a header go to the tunnel)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = b""

    async def peek(self) -> bytes:
        if not self.buffer:
            self.buffer = bytes(await self.stream.receive_some(65536))
        return self.buffer

    async def exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise trio.BrokenResourceError("closed")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    async def until(self, marker: bytes) -> bytes | None:
        while marker not in self.buffer:
            if len(self.buffer) > MAX_HEAD:
                return None
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                return None
            self.buffer += chunk
        out, _, self.buffer = self.buffer.partition(marker)
        return out


async def _pipe(reader: _Reader, upstream: trio.SocketStream) -> None:
    async def down() -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            while chunk := await upstream.receive_some(65536):
                await reader.stream.send_all(chunk)
        nursery.cancel_scope.cancel()

    async def up() -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            if reader.buffer:
                await upstream.send_all(reader.buffer)
                reader.buffer = b""
            while chunk := await reader.stream.receive_some(65536):
                await upstream.send_all(chunk)
            await upstream.send_eof()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(down)
        nursery.start_soon(up)


async def serve_forward_proxy(
    proxy: ForwardProxy, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run `proxy` on an ephemeral 127.0.0.1 port until cancelled; started() gets the port."""
    await proxy.run(task_status=task_status)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m daemon.fakes.forward_proxy",
        description="A recording forward proxy (HTTP CONNECT, absolute-form, SOCKS5) on "
        "127.0.0.1; names in --host only, IP literals as they are; prints what it carried.",
    )
    parser.add_argument("--port", type=int, default=8704, help="default %(default)s")
    parser.add_argument("--host", action="append", default=[], metavar="NAME=IP")
    parser.add_argument("--user", default=None, help="require these credentials")
    parser.add_argument("--password-env", default=None, help="variable holding the password")
    args = parser.parse_args(argv)
    hosts = dict(h.split("=", 1) for h in args.host)
    password = os.environ.get(args.password_env, "") if args.password_env else None
    proxy = ForwardProxy(hosts=hosts, username=args.user, password=password, port=args.port)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.run)
            print(f"forward proxy on http://127.0.0.1:{proxy.port}", flush=True)
            seen = 0
            while True:
                await trio.sleep(0.2)
                for item in proxy.carried[seen:]:
                    auth = "with credentials" if item.authorization else "no credentials"
                    verdict = "" if item.allowed else " (refused)"
                    print(f"{item.kind} {item.target} {auth}{verdict}", flush=True)
                seen = len(proxy.carried)

    try:
        trio.run(run)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
