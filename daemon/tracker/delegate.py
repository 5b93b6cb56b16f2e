# The network delegate: every Bilibili request goes through one of the named proxies assigned to
# its task kind, within that proxy's limits.
#
# Following the reference (packages/core/net/delegate.ts): the kind's proxies are tried in random
# order; one whose limits would be exceeded is skipped; `NoProxyAvailable` is raised only when all
# of them are limited; any other failure propagates at once (`UpstreamError`) without trying
# another proxy, since a network error is not a reason to spend a second proxy's budget. The
# limit arithmetic is pure (`proxy_limits.ProxyLimiter`); this module only moves bytes. A proxy
# is `direct`, an HTTP or SOCKS5 proxy URL (httpx; SOCKS through socksio), or a relay endpoint
# that takes `{url}` and answers `{statusCode, body, serverTime}` (the reference's Aliyun FC
# wrapper). The server time of an answer is the relay's `serverTime`, else the midpoint of
# request and response on our clock. An HTTP 412 (Bilibili's risk control) marks the proxy's
# windows as spent, so the next requests go through another proxy or wait.
#
# In a cluster (`shared` store) a named proxy of kind http, socks5 or relay is one egress that
# every instance listing it shares, so its windows live in the store and each request reserves
# its slot there on the database's clock (limiter_store.reserve: one transaction, a few ms); the
# in-memory limiter only mirrors them for /status. A `direct` proxy is this instance's own
# address: its windows stay in memory, saved under this instance's name.
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import trio

from daemon.clock import EpochClock, sleep_until_ms
from daemon.logs import get_logger
from daemon.net import tls
from daemon.redact import cap, redact_url
from daemon.store import Conn, Store
from daemon.tracker import limiter_store
from daemon.tracker.bilibili import NoProxyAvailable, Timed, UpstreamError
from daemon.tracker.config import ProxyConfig, TaskKind
from daemon.tracker.proxy_limits import ProxyLimiter

log = get_logger("tracker.net")

REQUEST_TIMEOUT = 10.0
"""Seconds for a direct or proxied request (the reference aborts native fetches after 10 s)."""
RELAY_TIMEOUT = 15.0
JITTER_MARGIN_MS = 100
"""Each window keeps this much of its burst unused (at most all but one request), so a request
delayed in transit by up to this long relative to the next one never makes Bilibili see a
limit exceeded. Steady rates are unchanged; bursts are that much smaller."""
SHARED_JITTER_MARGIN_MS = 250
"""The same margin for a proxy whose windows are shared in the store by several instances: a
request reserved there goes out from whichever process reserved it, so the gap between its
reservation and its arrival varies more (measured: a 100 ms margin let one request in about
ten busy runs arrive early enough for a -412)."""
HEADERS = {
    "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0 Safari/537.36",
    "Referer": "https://www.bilibili.com/",
    "Origin": "https://www.bilibili.com",
    "Accept": "application/json",
}


class _RelayAnswer(msgspec.Struct, rename="camel"):
    status_code: int
    body: str
    server_time: int | None = None


_relay_answer = msgspec.json.Decoder(_RelayAnswer)


@dataclass
class _Proxy:
    config: ProxyConfig
    limiter: ProxyLimiter
    http: httpx.AsyncClient
    own_http: bool
    requests: int = 0
    errors: int = 0
    limited: int = 0
    """Times this proxy was skipped because a request would have exceeded its limits."""
    refused: int = 0
    """HTTP 412 answers (Bilibili's rate-limit refusal)."""
    last_error: str | None = None
    counts: dict[str, int] = field(default_factory=dict)


def _same_transport(a: ProxyConfig, b: ProxyConfig) -> bool:
    return a.kind == b.kind and a.url == b.url


class NetworkDelegate:
    """Named proxies with per-proxy limits; `request(url, task)` returns the answer's bytes."""

    def __init__(
        self,
        proxies: list[ProxyConfig],
        *,
        clock: EpochClock,
        http: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
        margin_ms: int = JITTER_MARGIN_MS,
        shared_margin_ms: int = SHARED_JITTER_MARGIN_MS,
        shared: Store | None = None,
        instance: str = "",
    ) -> None:
        """`shared`: the store holding the windows of named proxies shared with other
        instances (None: every window is this process's); `instance`: whose saved windows
        are this process's (its `direct` proxies' in a cluster)."""
        self.clock = clock
        self.shared = shared
        self.prefix = f"{instance}/" if instance else ""
        self._penalties: set[str] = set()
        self.margin_ms = margin_ms
        self.shared_margin_ms = shared_margin_ms
        self.rng = rng or random.Random()
        self._own_shared = http is None
        self._shared = http or httpx.AsyncClient(timeout=REQUEST_TIMEOUT, verify=tls.verifying())
        self._retired: list[httpx.AsyncClient] = []
        self._proxies: dict[str, _Proxy] = {}
        self.apply(proxies)

    def _client_for(self, config: ProxyConfig) -> tuple[httpx.AsyncClient, bool]:
        if config.kind in ("http", "socks5"):
            assert config.url is not None
            client = httpx.AsyncClient(
                proxy=config.url, timeout=REQUEST_TIMEOUT, verify=tls.verifying()
            )
            return client, True
        return self._shared, False

    def apply(self, proxies: list[ProxyConfig]) -> None:
        """Take a new proxy list (SIGHUP): a proxy keeps its name's limiter state for every
        window that is unchanged, and its connection pool if its kind and url are unchanged."""
        if not proxies:
            raise ValueError("the delegate needs at least one proxy")
        now = self.clock()
        old = self._proxies
        fresh: dict[str, _Proxy] = {}
        for config in proxies:
            limiter = ProxyLimiter(config.limits, config.bulk_limits, now, self.margin_ms)
            before = old.get(config.name)
            if before is not None:
                limiter.take_over(before.limiter)
            if before is not None and _same_transport(before.config, config):
                http, own = before.http, before.own_http
            else:
                http, own = self._client_for(config)
                if before is not None and before.own_http:
                    self._retired.append(before.http)
            proxy = _Proxy(config, limiter, http, own)
            if before is not None:
                proxy.requests, proxy.errors = before.requests, before.errors
                proxy.limited, proxy.refused = before.limited, before.refused
            fresh[config.name] = proxy
        for name, proxy in old.items():
            if name not in fresh and proxy.own_http:
                self._retired.append(proxy.http)
        self._proxies = fresh

    def assume_idle(self) -> None:
        """Forget the limiter history: for an upstream known to have seen no request from these
        proxies (a fresh simulator in tests and benchmarks), every burst is available."""
        for proxy in self._proxies.values():
            proxy.limiter.restore(dict.fromkeys(proxy.limiter.tats, 0))

    def penalize(self, proxy: str) -> None:
        """Bilibili refused a request through `proxy` for its rate (-412): count its windows as
        spent now, so the next requests take another proxy or wait."""
        found = self._proxies.get(proxy)
        if found is not None:
            found.refused += 1
            found.limiter.exhaust(self.clock())
            if self._is_shared(found):
                self._penalties.add(proxy)  # the next reservation through it spends the store's

    def _is_shared(self, proxy: _Proxy) -> bool:
        return self.shared is not None and proxy.config.kind != "direct"

    async def _reserve(self, proxy: _Proxy, bulk: bool) -> int | None:
        """Reserve a request through `proxy`: None if granted, else how many ms from now until
        it would conform."""
        now = self.clock()
        if not self._is_shared(proxy):
            if proxy.limiter.try_acquire(now, bulk=bulk):
                return None
            return proxy.limiter.available_at(now, bulk=bulk) - now
        assert self.shared is not None
        name, windows = proxy.config.name, proxy.limiter.applicable(bulk)
        exhaust = name in self._penalties
        self._penalties.discard(name)
        got = await self.shared.write(
            lambda conn: limiter_store.reserve(
                conn, name, windows, margin_ms=self.shared_margin_ms, exhaust=exhaust
            )
        )
        proxy.limiter.restore(got.tats_ms)
        return None if got.granted else got.at_ms - got.now_ms

    async def room(self, task: TaskKind, horizon_ms: int, limit: int) -> int:
        """How many requests of `task` (at most `limit`) the task's proxies let through within
        the next `horizon_ms`, by their limits' state now (a shared proxy's in the store, where
        a -412 not yet charged is charged first). Reserves nothing."""
        bulk, total = task == "bulk", 0
        for proxy in self._proxies.values():
            if task not in proxy.config.tasks or total >= limit:
                continue
            if not self._is_shared(proxy):
                total += proxy.limiter.room(self.clock(), horizon_ms, bulk=bulk, limit=limit)
                continue
            if proxy.config.name in self._penalties:
                await self._charge_penalty(proxy)
            total += await self._shared_room(proxy, bulk, horizon_ms, limit)
        return min(total, limit)

    async def _charge_penalty(self, proxy: _Proxy) -> None:
        """Spend a refused shared proxy's windows in the store now. `room` does it before
        counting: a tick that finds no room sends nothing, so a penalty left for the next
        reservation would never be charged, and the proxy would have no room for good."""
        assert self.shared is not None
        name, windows = proxy.config.name, proxy.limiter.applicable(True)
        tats = await self.shared.write(lambda conn: limiter_store.exhaust(conn, name, windows))
        self._penalties.discard(name)
        proxy.limiter.restore(tats)

    async def _shared_room(self, proxy: _Proxy, bulk: bool, horizon_ms: int, limit: int) -> int:
        """`room` of a shared proxy by its windows in the store (a read; the first time, a
        write that starts its windows as a reservation would)."""
        assert self.shared is not None
        name, windows = proxy.config.name, proxy.limiter.applicable(bulk)

        def free(conn: Conn, create: bool) -> int | None:
            return limiter_store.room(
                conn,
                name,
                windows,
                horizon_ms,
                limit,
                margin_ms=self.shared_margin_ms,
                create=create,
            )

        got = await self.shared.read(lambda conn: free(conn, False))
        if got is None:
            got = await self.shared.write(lambda conn: free(conn, True))
        return got or 0

    def proxies_for(self, task: TaskKind) -> list[str]:
        return [name for name, p in self._proxies.items() if task in p.config.tasks]

    async def request(self, url: str, task: TaskKind, *, wait: float = 0.0) -> Timed[bytes]:
        """GET `url` through one of the task's proxies. With `wait` > 0, when every proxy is
        limited but one has room within `wait` seconds, sleep until then instead of raising."""
        bulk = task == "bulk"
        deadline = self.clock() + round(wait * 1000)
        while True:
            candidates = [p for p in self._proxies.values() if task in p.config.tasks]
            if not candidates:
                raise NoProxyAvailable(task)
            self.rng.shuffle(candidates)
            waits = []
            for proxy in candidates:
                wait_ms = await self._reserve(proxy, bulk)
                if wait_ms is None:
                    return await self._send(proxy, url, task)
                proxy.limited += 1
                waits.append(wait_ms)
            now = self.clock()
            soonest = now + max(min(waits), 0)
            if soonest > deadline:
                raise NoProxyAvailable(task, soonest - now)
            await sleep_until_ms(self.clock, soonest)

    async def _send(self, proxy: _Proxy, url: str, task: TaskKind) -> Timed[bytes]:
        name = proxy.config.name
        proxy.requests += 1
        proxy.counts[task] = proxy.counts.get(task, 0) + 1
        started = self.clock()
        try:
            if proxy.config.kind == "relay":
                assert proxy.config.url is not None
                response = await proxy.http.post(
                    proxy.config.url, json={"url": url}, timeout=RELAY_TIMEOUT
                )
                finished = self.clock()
                if response.status_code != 200:
                    raise UpstreamError(
                        f"relay {name} answered HTTP {response.status_code}",
                        status=response.status_code,
                        body=response.content,
                        proxy=name,
                    )
                try:
                    relayed = _relay_answer.decode(response.content)
                except msgspec.DecodeError as exc:
                    raise UpstreamError(
                        f"relay {name} answered an unexpected shape: {exc}", proxy=name
                    ) from None
                status, body = relayed.status_code, relayed.body.encode()
                server_ms = relayed.server_time or (started + finished) // 2
            else:
                response = await proxy.http.get(url, headers=HEADERS)
                finished = self.clock()
                status, body = response.status_code, response.content
                server_ms = (started + finished) // 2
        except httpx.HTTPError as exc:
            self._failed(proxy, f"{type(exc).__name__}: {exc}")
            raise UpstreamError(
                f"request through {name} failed: {type(exc).__name__}: {redact_url(url)}",
                proxy=name,
            ) from exc
        except UpstreamError as exc:
            self._failed(proxy, str(exc))
            raise
        if status != 200:
            if status == 412:
                self.penalize(name)
            self._failed(proxy, f"HTTP {status}")
            raise UpstreamError(
                f"HTTP {status} through {name} for {redact_url(url)}",
                status=status,
                body=body,
                proxy=name,
            )
        return Timed(body, server_ms, name)

    def _failed(self, proxy: _Proxy, error: str) -> None:
        proxy.errors += 1
        proxy.last_error = cap(error)

    async def load_state(self, store: Store) -> None:
        """Restore the limiter state a clean shutdown stored; after a crash (or on a fresh
        database) every window stays conservative: as if its whole burst was just spent."""
        state, clean = await store.write(lambda conn: limiter_store.take_state(conn, self.prefix))
        if not clean:
            log.info("no clean limiter state stored; starting limits conservatively")
            for proxy in self._proxies.values():
                proxy.limiter.exhaust(self.clock())
            return
        for name, proxy in self._proxies.items():
            proxy.limiter.restore({key: tat for (p, key), tat in state.items() if p == name})

    def state(self) -> limiter_store.State:
        """Every window's TAT in epoch ms by (proxy, window key), of the proxies whose windows
        are this process's (not those shared through the store)."""
        return {
            (name, key): tat
            for name, proxy in self._proxies.items()
            if not self._is_shared(proxy)
            for key, tat in proxy.limiter.tats_ms().items()
        }

    async def save_state(self, store: Store, *, final: bool = False) -> None:
        """Store the limiter state; `final` at shutdown, after the last request, so the next
        start may trust it (see `limiter_store`)."""
        state, now_ms = self.state(), self.clock()
        await store.write(
            lambda conn: limiter_store.save_state(
                conn, state, clean=final, now_ms=now_ms, prefix=self.prefix
            )
        )

    def status(self) -> list[dict[str, Any]]:
        """Each proxy: name, kind, redacted url, tasks, request counts and its windows' fill."""
        now = self.clock()
        return [
            {
                "name": name,
                "kind": p.config.kind,
                "limits_shared": self._is_shared(p),
                "url": redact_url(p.config.url) if p.config.url else None,
                "tasks": list(p.config.tasks),
                "requests": p.requests,
                "requests_by_task": dict(p.counts),
                "errors": p.errors,
                "skipped_limited": p.limited,
                "refused_412": p.refused,
                "last_error": p.last_error,
                "jitter_margin_ms": self.margin_ms,
                "limits": p.limiter.fill(now),
            }
            for name, p in self._proxies.items()
        ]

    async def aclose(self) -> None:
        clients = [p.http for p in self._proxies.values() if p.own_http] + self._retired
        if self._own_shared:
            clients.append(self._shared)
        self._retired = []
        with trio.CancelScope(shield=True):
            for client in clients:
                await client.aclose()
