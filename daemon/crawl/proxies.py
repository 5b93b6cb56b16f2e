# Outbound proxies of the crawl engine (`[crawl] proxies`, `stealth_proxies`, issue 26 item 5).
#
# Rules only, no I/O: which upstream proxy carries a request (rotation per host or per
# request), which pools a request's `proxy` option tries (basic, then stealth on 401/403/429 for
# `auto`, as Firecrawl's 2025 code retries), credentials taken from the environment (the file
# names variables, never holds a secret), and per-proxy counts for /status and /metrics. The
# fetcher (daemon/crawl/fetching/fetch.py) and the browser's vetting proxy
# (daemon/crawl/fetching/proxy.py) do the talking; both vet the TARGET with the SSRF guard before
# anything reaches a proxy.
#
# Per host rotation hashes the host name, so one site's pages go through one proxy in every
# process and instance (a site sees one address, a session stays on one exit); per request
# rotation goes round the pool.
from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import os
import ssl
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from prometheus_client import Counter as PromCounter

from daemon.config_types import Section
from daemon.metrics import REGISTRY

__all__ = [
    "RETRY_STATUSES",
    "Proxies",
    "ProxyPool",
    "ProxyServer",
    "Upstream",
    "proxy_problems",
]

SCHEMES = ("http", "https", "socks5", "socks5h")
RETRY_STATUSES = frozenset({401, 403, 429})
"""Answers after which `proxy: auto` tries the stealth pool (Firecrawl's 2025 scrapeURL)."""
Rotation = Literal["per_host", "per_request"]

proxy_requests = PromCounter(
    "crawld_crawl_proxy_requests",
    "Requests sent through an outbound proxy, by proxy, pool and outcome (ok: an HTTP answer "
    "came back through it; else the Firecrawl error code)",
    ["proxy", "pool", "outcome"],
    registry=REGISTRY,
)


class ProxyServer(Section, frozen=True):
    """One upstream proxy of `[crawl] proxies` or `stealth_proxies`."""

    url: str
    """http://, https:// or socks5:// URL with host and port, no credentials."""
    username_env: str | None = None
    """Environment variable holding the user name (Proxy-Authorization Basic / SOCKS5 auth)."""
    password_env: str | None = None
    """Environment variable holding the password (needs username_env)."""
    name: str = ""
    """Label in /status and /metrics; default scheme://host:port."""
    ca_file: str = ""
    """PEM file of the CA that signed an https:// proxy's certificate (empty: the system's)."""


def proxy_problems(
    servers: Sequence[ProxyServer], path: str, environ: Mapping[str, str] | None = None
) -> list[str]:
    """Problems of a proxy list, each ending with its key path (`$.crawl.proxies[1].url`)."""
    env = os.environ if environ is None else environ
    problems: list[str] = []
    names: set[str] = set()
    for i, server in enumerate(servers):
        at = f"{path}[{i}]"
        problem = _url_problem(server.url)
        if problem is not None:
            problems.append(f"{problem} - at `{at}.url`")
            continue
        for key in ("username_env", "password_env"):
            var = getattr(server, key)
            if var is not None and (not var or var not in env):
                problems.append(f"environment variable {var!r} is not set - at `{at}.{key}`")
        if server.ca_file and not server.url.startswith("https://"):
            problems.append(f"ca_file is only for an https:// proxy - at `{at}.ca_file`")
        elif server.ca_file and not os.path.isfile(server.ca_file):
            problems.append(f"{server.ca_file!r} is not a file - at `{at}.ca_file`")
        if server.password_env is not None and server.username_env is None:
            problems.append(f"password_env needs username_env - at `{at}.password_env`")
        label = label_of(server)
        if label in names:
            problems.append(f"duplicate proxy {label!r} - at `{at}.name`")
        names.add(label)
    return problems


def _url_problem(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return f"{url[:80]!r} is not a URL"
    if parts.scheme not in SCHEMES:
        return "must be an http://, https:// or socks5:// URL"
    if "@" in parts.netloc:
        return "credentials do not belong in the file: name variables in username_env/password_env"
    if not parts.hostname:
        return "has no host"
    if port is None:
        return "needs an explicit port (e.g. http://proxy.example:3128)"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "must be scheme://host:port only"
    return None


def label_of(server: ProxyServer) -> str:
    if server.name:
        return server.name
    parts = urlsplit(server.url)
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    return f"{parts.scheme}://{host}:{parts.port}"


@dataclass(frozen=True)
class Upstream:
    """A configured proxy with its credentials read from the environment. `name` and `url`
    carry no secret; `username`/`password` never leave this object except as the proxy's
    own authentication."""

    name: str
    url: str
    scheme: str
    host: str
    port: int
    pool: str
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    ca_file: str = ""

    @classmethod
    def of(
        cls, server: ProxyServer, pool: str, environ: Mapping[str, str] | None = None
    ) -> Upstream:
        env = os.environ if environ is None else environ
        parts = urlsplit(server.url)
        assert parts.hostname is not None and parts.port is not None
        username = env.get(server.username_env) if server.username_env else None
        password = env.get(server.password_env, "") if server.password_env else None
        scheme = "socks5" if parts.scheme == "socks5h" else parts.scheme
        return cls(
            name=label_of(server),
            url=f"{scheme}://{parts.netloc}",
            scheme=scheme,
            host=parts.hostname,
            port=parts.port,
            pool=pool,
            username=username,
            password=password if username is not None else None,
            ca_file=server.ca_file,
        )

    def httpx_proxy(self) -> httpx.Proxy:
        """The httpx proxy (http(s): Proxy-Authorization Basic; socks5: RFC 1929 auth).
        socks5 sends the host NAME to the proxy (as socks5h does), never an address."""
        auth = (self.username, self.password or "") if self.username is not None else None
        return httpx.Proxy(self.url, auth=auth, ssl_context=self.ssl_context)

    @functools.cached_property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The context verifying an https:// proxy (its `ca_file`, else the system's CAs)."""
        if self.scheme != "https":
            return None
        if self.ca_file:
            return ssl.create_default_context(cafile=self.ca_file)
        return ssl.create_default_context()

    def authorization(self) -> str | None:
        """The Proxy-Authorization value for an HTTP CONNECT, None without credentials."""
        if self.username is None:
            return None
        raw = f"{self.username}:{self.password or ''}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")

    def secrets(self) -> tuple[str, ...]:
        """Values that must never appear in an answer or a log."""
        return tuple(s for s in (self.username, self.password) if s)


class ProxyPool:
    """One pool of upstreams and its rotation."""

    def __init__(self, upstreams: Sequence[Upstream], rotation: Rotation = "per_host") -> None:
        if not upstreams:
            raise ValueError("a proxy pool needs at least one proxy")
        self.upstreams = tuple(upstreams)
        self.rotation = rotation
        self._turn = itertools.count()

    def pick(self, host: str) -> Upstream:
        """The upstream for a request to `host`: the same one for a host (per_host), the next
        one in turn (per_request)."""
        n = len(self.upstreams)
        if n == 1:
            return self.upstreams[0]
        if self.rotation == "per_request":
            return self.upstreams[next(self._turn) % n]
        digest = hashlib.sha256(host.lower().encode()).digest()
        return self.upstreams[int.from_bytes(digest[:8], "big") % n]


class Proxies:
    """The basic and stealth pools (either may be absent: no basic pool means direct
    connections) and what each went through."""

    def __init__(
        self,
        basic: Sequence[Upstream] = (),
        stealth: Sequence[Upstream] = (),
        rotation: Rotation = "per_host",
    ) -> None:
        self.basic = ProxyPool(basic, rotation) if basic else None
        self.stealth = ProxyPool(stealth, rotation) if stealth else None
        self.rotation = rotation
        self.counts: dict[str, Counter[str]] = {u.name: Counter() for u in (*basic, *stealth)}

    @classmethod
    def from_servers(
        cls,
        basic: Sequence[ProxyServer],
        stealth: Sequence[ProxyServer],
        rotation: Rotation = "per_host",
        environ: Mapping[str, str] | None = None,
    ) -> Proxies:
        return cls(
            [Upstream.of(s, "basic", environ) for s in basic],
            [Upstream.of(s, "stealth", environ) for s in stealth],
            rotation,
        )

    @property
    def active(self) -> bool:
        return self.basic is not None or self.stealth is not None

    def attempts(self, option: str | None) -> list[str]:
        """The pools a request with `proxy: option` tries, in order ("basic" may mean direct):

        - basic: the basic pool (direct without one);
        - stealth / enhanced: the stealth pool, or basic when there is none (Firecrawl
          self-hosted without a stealth engine scrapes them as basic);
        - auto (Firecrawl's default, also when absent): basic, then the stealth pool when the
          answer is 401, 403 or 429 and a stealth pool exists."""
        if option in ("stealth", "enhanced"):
            return ["stealth"] if self.stealth is not None else ["basic"]
        if option == "basic" or self.stealth is None:
            return ["basic"]
        return ["basic", "stealth"]

    def pool(self, name: str) -> ProxyPool | None:
        return self.stealth if name == "stealth" else self.basic

    def pick(self, pool: str, host: str) -> Upstream | None:
        chosen = self.pool(pool)
        return chosen.pick(host) if chosen is not None else None

    def count(self, upstream: Upstream, outcome: str) -> None:
        self.counts.setdefault(upstream.name, Counter())[outcome] += 1
        proxy_requests.labels(upstream.name, upstream.pool, outcome).inc()

    def secrets(self) -> tuple[str, ...]:
        pools = [p for p in (self.basic, self.stealth) if p is not None]
        return tuple(s for p in pools for u in p.upstreams for s in u.secrets())

    def status(self) -> dict[str, Any]:
        """What /status shows: pools, rotation and per-proxy counts, never a credential."""

        def shown(pool: ProxyPool | None) -> list[dict[str, Any]]:
            if pool is None:
                return []
            return [
                {
                    "name": u.name,
                    "url": u.url,
                    "auth": u.username is not None,
                    "requests": sum(self.counts.get(u.name, Counter()).values()),
                    "outcomes": dict(self.counts.get(u.name, Counter())),
                }
                for u in pool.upstreams
            ]

        return {
            "rotation": self.rotation,
            "basic": shown(self.basic),
            "stealth": shown(self.stealth),
        }
