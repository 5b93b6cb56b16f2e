# Tunnels through an upstream proxy for the browser's vetting proxy
# (daemon/crawl/fetching/proxy.py). The browser speaks SOCKS5 to crawld, crawld vets the target,
# then opens the connection through the configured proxy instead of directly: HTTP CONNECT host:port
# (over TLS to an https:// proxy), or SOCKS5 CONNECT with the domain name (socksio for the wire
# format, as httpx does). Either way the proxy gets the vetted NAME and resolves it itself, and
# credentials come from the environment (Upstream), never from the page.
from __future__ import annotations

import ssl

import trio
from socksio import socks5

from daemon.crawl.proxies import Upstream

__all__ = ["TunnelFailed", "connect_request", "open_tunnel"]

MAX_CONNECT_HEAD = 8192


class TunnelFailed(Exception):
    """The upstream proxy could not be reached or refused the tunnel; `reason` names the proxy
    by its label only."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def connect_request(upstream: Upstream, host: str, port: int) -> bytes:
    """The HTTP CONNECT request for `host:port` (with Proxy-Authorization when configured)."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if (auth := upstream.authorization()) is not None:
        lines.append(f"Proxy-Authorization: {auth}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


def connect_status(head: bytes) -> int | None:
    """The status code of a CONNECT answer's head, None when it is not HTTP."""
    first = head.split(b"\r\n", 1)[0].split(b" ")
    if len(first) < 2 or not first[0].startswith(b"HTTP/1.") or not first[1].isdigit():
        return None
    return int(first[1])


async def open_tunnel(
    upstream: Upstream, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None
) -> trio.abc.Stream:
    """A stream to `host:port` through `upstream`; TunnelFailed otherwise (the caller bounds
    the time)."""
    try:
        raw: trio.abc.Stream = await trio.open_tcp_stream(upstream.host, upstream.port)
    except OSError as exc:
        raise TunnelFailed(f"cannot connect to proxy {upstream.name}: {exc.strerror}") from None
    try:
        stream = raw
        if upstream.scheme == "https":
            context = ssl_context or upstream.ssl_context or ssl.create_default_context()
            stream = trio.SSLStream(raw, context, server_hostname=upstream.host)
            await stream.do_handshake()
        if upstream.scheme == "socks5":
            await _socks5(stream, upstream, host, port)
        else:
            await _connect(stream, upstream, host, port)
        return stream
    except TunnelFailed:
        await trio.aclose_forcefully(raw)
        raise
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError) as exc:
        await trio.aclose_forcefully(raw)
        raise TunnelFailed(f"proxy {upstream.name} failed: {type(exc).__name__}") from None


async def _connect(stream: trio.abc.Stream, upstream: Upstream, host: str, port: int) -> None:
    await stream.send_all(connect_request(upstream, host, port))
    head = b""
    # Byte by byte up to the blank line: nothing of the tunnel itself is read here.
    while not head.endswith(b"\r\n\r\n"):
        if len(head) > MAX_CONNECT_HEAD:
            raise TunnelFailed(f"proxy {upstream.name} sent an oversized answer")
        byte = await stream.receive_some(1)
        if not byte:
            raise TunnelFailed(f"proxy {upstream.name} closed the connection")
        head += byte
    status = connect_status(head)
    if status is None or not 200 <= status < 300:
        raise TunnelFailed(f"proxy {upstream.name} refused the tunnel ({status or 'not HTTP'})")


async def _socks5(stream: trio.abc.Stream, upstream: Upstream, host: str, port: int) -> None:
    conn = socks5.SOCKS5Connection()
    method = (
        socks5.SOCKS5AuthMethod.USERNAME_PASSWORD
        if upstream.username is not None
        else socks5.SOCKS5AuthMethod.NO_AUTH_REQUIRED
    )
    conn.send(socks5.SOCKS5AuthMethodsRequest([method]))
    await stream.send_all(conn.data_to_send())
    reply = conn.receive_data(bytes(await stream.receive_some(4096)))
    if not isinstance(reply, socks5.SOCKS5AuthReply) or reply.method != method:
        raise TunnelFailed(f"proxy {upstream.name} refused the SOCKS5 authentication method")
    if method == socks5.SOCKS5AuthMethod.USERNAME_PASSWORD:
        conn.send(
            socks5.SOCKS5UsernamePasswordRequest(
                (upstream.username or "").encode(), (upstream.password or "").encode()
            )
        )
        await stream.send_all(conn.data_to_send())
        auth = conn.receive_data(bytes(await stream.receive_some(4096)))
        if not isinstance(auth, socks5.SOCKS5UsernamePasswordReply) or not auth.success:
            raise TunnelFailed(f"proxy {upstream.name} refused the credentials")
    # A name goes as a domain name (the proxy resolves it), an address literal as an address.
    conn.send(socks5.SOCKS5CommandRequest.from_address(socks5.SOCKS5Command.CONNECT, (host, port)))
    await stream.send_all(conn.data_to_send())
    answer = conn.receive_data(bytes(await stream.receive_some(4096)))
    if (
        not isinstance(answer, socks5.SOCKS5Reply)
        or answer.reply_code != socks5.SOCKS5ReplyCode.SUCCEEDED
    ):
        code = getattr(answer, "reply_code", None)
        raise TunnelFailed(f"proxy {upstream.name} refused the connection ({code})")
