# Keep-alive connections to any number of origins, as an httpx transport: the crawl's fetcher
# sends every page of every crawl through one of these (daemon/crawl/fetching/fetch.py).
#
# Why not httpx's own transport: httpcore's pool scans every pooled connection, and polls each
# idle one's socket, when a request starts and again when it ends, under a lock. At a crawl's
# concurrency of 16 that was a fifth of the trio thread's time per page (profiled on
# scripts/bench_crawl.py). The crawl caps its requests in flight itself (the global fetch slots
# and the per-host gate), so all this needs to do is what HostConnections does for one webhook
# host (daemon/net/connections.py), per origin: a stack of idle connections for each (scheme,
# address, port), the one taken checked once, put back once its answer was read to the end. The
# connections are daemon/net/h1.py's, not httpcore's: one request at a time each, no locks.
#
# Bounds: at most `max_idle` connections idle in all, the longest idle closed first when another
# is put back; an idle connection past its keep-alive is closed when any connection is put back
# (checked by the time it was put back, without touching its socket), so hosts a crawl has left
# do not keep sockets open.
from __future__ import annotations

import ssl
from collections import OrderedDict

import httpcore
import trio

from daemon.net.connections import KEEPALIVE_S, Connection, HostConnections
from daemon.net.h1 import H1Connection

Key = tuple[bytes, bytes, int]
"""An origin's (scheme, host, port): httpcore.Origin is not hashable."""


def _key(origin: httpcore.Origin) -> Key:
    return origin.scheme, origin.host, origin.port


class OriginConnections(HostConnections):
    """Keep-alive HTTP/1.1 connections to any origin; at most `max_idle` idle in all. The
    caller caps how many requests run at once (one connection each)."""

    connection_type = H1Connection

    def __init__(
        self,
        *,
        max_idle: int,
        ssl_context: ssl.SSLContext | None = None,
        keepalive_expiry: float = KEEPALIVE_S,
    ) -> None:
        super().__init__(max_idle=max_idle, ssl_context=ssl_context,
                         keepalive_expiry=keepalive_expiry)  # fmt: skip
        self._origin: dict[Connection, Key] = {}
        """Every open connection's origin."""
        self._stacks: dict[Key, list[Connection]] = {}
        self._since: OrderedDict[Connection, float] = OrderedDict()
        """The idle connections, longest idle first, with when they were put back."""

    @property
    def idle(self) -> int:
        return len(self._since)

    def _connect(self, origin: httpcore.Origin) -> Connection:
        conn = super()._connect(origin)
        self._origin[conn] = _key(origin)
        return conn

    async def _take(self, origin: httpcore.Origin) -> Connection | None:
        key = _key(origin)
        stack = self._stacks.get(key)
        while stack:
            conn = stack.pop()
            del self._since[conn]
            if not stack:
                del self._stacks[key]
            if conn.is_idle() and not conn.has_expired():
                return conn
            await self._discard(conn)
        return None

    async def _release(self, conn: Connection) -> None:
        if self._closed or not conn.is_idle():
            await self._discard(conn)
            return
        now = trio.current_time()
        self._stacks.setdefault(self._origin[conn], []).append(conn)
        self._since[conn] = now
        while self._since:
            oldest, since = next(iter(self._since.items()))
            if len(self._since) <= self.max_idle and now - since <= self.keepalive_expiry:
                break
            self._unstack(oldest)
            await self._discard(oldest)

    def _unstack(self, conn: Connection) -> None:
        del self._since[conn]
        origin = self._origin[conn]
        stack = self._stacks[origin]
        stack.remove(conn)
        if not stack:
            del self._stacks[origin]

    async def _discard(self, conn: Connection) -> None:
        self._origin.pop(conn, None)
        await super()._discard(conn)

    async def aclose(self) -> None:
        self._closed = True
        idle = list(self._since)
        self._since.clear()
        self._stacks.clear()
        for conn in idle:
            await self._discard(conn)
