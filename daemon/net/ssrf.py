# The SSRF guard for every outbound request whose URL a user chose (webhooks, crawl fetches and
# their redirects, proxies): such a request must never reach the daemon's own network (cloud
# metadata at 169.254.169.254, loopback admin ports, private services). It lives in `net`, not in
# one area, because every area that fetches on a user's behalf calls it. The guard resolves the
# host once, drops every address in a blocked range (after unwrapping IPv4 embedded in IPv6:
# mapped, compatible, 6to4, NAT64, Teredo), and then connects to the address it vetted, so DNS
# rebinding between check and connect cannot happen. It fails closed: no address, no request.
#
# Connecting to the vetted address while keeping the name: the URL's host is replaced by the IP,
# the Host header is set to the original host[:port], and httpcore's `sni_hostname` request
# extension makes TLS send the original name as SNI and verify the certificate against it
# (httpcore/_async/connection.py passes it as `server_hostname` to start_tls). Redirects are
# never followed (a 3xx is a failed attempt), so there is no second hop to re-check. The crawl
# engine (daemon/crawl/fetching/fetch.py) reuses `vet_url` and `pinned_core_get` for GETs and vets
# each redirect hop itself; it passes a `resolver` so tests can map test host names to 127.0.0.1.
#
# The ranges are listed here rather than taken from `ipaddress.is_global`, whose answers change
# between Python releases; `is_global` only backs the table up (anything it calls non-global is
# refused too). `allow_cidrs` is the operator's escape hatch, checked per address: allowing
# 127.0.0.0/8 allows loopback, nothing else.
#
# One caveat for callers sharing an httpx.AsyncClient: its pool is keyed by (scheme, IP, port),
# so two https hosts on one IP may share a TLS connection verified for the first name. The
# webhook drainer therefore uses one client per destination host.
#
# Vetting a name costs a getaddrinfo per request, so a `VettingCache` may keep a vetted address
# for a short time (VETTING_TTL, 30 s): requests in that window connect to the address that was
# vetted, exactly as a single request does, so caching adds no window for rebinding; it only
# delays noticing that a name now points elsewhere by at most the TTL. Failures are not cached.
from __future__ import annotations

import base64
import functools
import http.cookiejar
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import httpcore
import httpx
import msgspec
import trio

from daemon.net import tls
from daemon.net.connections import HostConnections
from daemon.net.ttlcache import TtlCache

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_RESPONSE_BODY = 4096
_REENCODED = frozenset({"content-encoding", "content-length", "transfer-encoding"})

_V4_BLOCKED: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "unspecified"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared address space (CGNAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "reserved (IETF protocol assignments)"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "reserved (6to4 relay anycast)"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "reserved (benchmarking)"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("255.255.255.255/32", "broadcast"),
    ("240.0.0.0/4", "reserved"),
)
_V6_BLOCKED: tuple[tuple[str, str], ...] = (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::ffff:0:0:0/96", "reserved (IPv4-translated, SIIT)"),
    ("64:ff9b:1::/48", "reserved (local-use NAT64)"),
    ("100::/64", "reserved (discard-only)"),
    ("2001:2::/48", "reserved (benchmarking)"),
    ("2001:10::/28", "reserved (ORCHID)"),
    ("2001:db8::/32", "documentation"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "reserved (SRv6 SIDs)"),
    ("fc00::/7", "private (unique local)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "private (site-local)"),
    ("ff00::/8", "multicast"),
)
_V4_TABLE = [(ipaddress.IPv4Network(n), r) for n, r in _V4_BLOCKED]
_V6_TABLE = [(ipaddress.IPv6Network(n), r) for n, r in _V6_BLOCKED]
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""(host, port) -> the host's addresses; raises OSError when it does not resolve."""
_COMPAT = ipaddress.IPv6Network("::/96")


class BlockedAddress(Exception):
    """The URL may not be requested; `reason` says why (safe to show the user)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ResolutionFailed(BlockedAddress):
    """The host did not resolve. Nothing was sent; unlike a blocked address this may be
    temporary, so a drainer may retry it (error kind "dns")."""


class Vetted(msgspec.Struct, frozen=True):
    ip: str
    host: str
    """The URL's host (IDNA-encoded), for SNI."""
    port: int
    scheme: str


VETTING_TTL = 30.0
"""Seconds a `VettingCache` keeps a vetted address."""


class VettingCache:
    """Vetted addresses by (URL, allow list) for `ttl` seconds of a monotonic clock the caller
    passes in; at most `max_entries`."""

    def __init__(self, ttl: float = VETTING_TTL, max_entries: int = 4096) -> None:
        self._cache: TtlCache[tuple[str, tuple[Network, ...]], Vetted] = TtlCache(ttl, max_entries)

    def get(self, url: str, allow: Sequence[Network], now: float) -> Vetted | None:
        return self._cache.get((url, tuple(allow)), now)

    def put(self, url: str, allow: Sequence[Network], vetted: Vetted, now: float) -> None:
        self._cache.put((url, tuple(allow)), vetted, now)

    def clear(self) -> None:
        self._cache.clear()

    def __len__(self) -> int:
        return len(self._cache)


def parse_networks(cidrs: Iterable[str]) -> list[Network]:
    """`webhooks.allow_cidrs` as networks (host bits allowed, as config validation does)."""
    return [ipaddress.ip_network(c, strict=False) for c in cidrs]


def _embedded_v4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, str] | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, "IPv4-mapped"
    if ip.sixtofour is not None:
        return ip.sixtofour, "6to4"
    if ip.teredo is not None:
        return ip.teredo[1], "Teredo"
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF), "NAT64"
    if ip in _COMPAT and int(ip) > 1:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF), "IPv4-compatible"
    return None


def _v4_reason(ip: ipaddress.IPv4Address) -> str | None:
    for net, reason in _V4_TABLE:
        if ip in net:
            return reason
    return None if ip.is_global else "not globally routable"


def _allowed(ips: Iterable[IPAddress], allow: Sequence[Network]) -> bool:
    return any(ip.version == net.version and ip in net for ip in ips for net in allow)


def is_blocked(ip: str | IPAddress, allow: Sequence[Network] = ()) -> str | None:
    """Why `ip` may not be contacted, or None if it may. `allow` (parsed allow_cidrs) wins."""
    addr = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
    if isinstance(addr, ipaddress.IPv6Address) and addr.scope_id:
        addr = ipaddress.IPv6Address(addr.compressed.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv4Address):
        if _allowed([addr], allow):
            return None
        reason = _v4_reason(addr)
        return f"{reason} address {addr}" if reason else None
    embedded = _embedded_v4(addr)
    if _allowed([addr] + ([embedded[0]] if embedded else []), allow):
        return None
    if embedded is not None:
        v4, form = embedded
        reason = _v4_reason(v4)
        if reason:
            return f"{form} form of {reason} address {v4} ({addr})"
        if form == "IPv4-compatible":
            return f"deprecated IPv4-compatible address {addr}"
        return None
    for net, reason in _V6_TABLE:
        if addr in net:
            return f"{reason} address {addr}"
    return None if addr.is_global else f"not globally routable address {addr}"


async def system_resolver(host: str, port: int) -> list[str]:
    """The system resolver (getaddrinfo in a thread), addresses in its order."""
    infos = await trio.socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@functools.lru_cache(maxsize=4096)
def _literal(host: str) -> str | None:
    """`host` as the compressed text of the IP address it spells, or None for a name."""
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        return None


@functools.lru_cache(maxsize=4096)
def _verdict(address: str, allow: tuple[Network, ...]) -> str | None:
    """`is_blocked(address, allow)`, remembered: a pure function of its arguments, asked again
    for every page of a crawl (parsing the address was most of a vetting's time)."""
    return is_blocked(address, allow)


async def vet_url(
    url: str | httpx.URL, allow: Sequence[Network] = (), *, resolver: Resolver | None = None
) -> Vetted:
    """Resolve the URL's host (with `resolver`, the system's by default) and pick the first
    address that is not blocked.

    Raises BlockedAddress for a non-http(s) URL or when every address is blocked, and
    ResolutionFailed when the host does not resolve.
    """
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise BlockedAddress(f"invalid URL: {exc}") from None
    scheme = parsed.scheme
    if scheme not in ("http", "https"):
        raise BlockedAddress(f"scheme {scheme!r} is not allowed; use http or https")
    host = parsed.raw_host.decode("ascii")
    if not host:
        raise BlockedAddress("the URL has no host")
    port = parsed.port or (443 if scheme == "https" else 80)
    literal = _literal(host)
    if literal is not None:
        candidates = [literal]
    else:
        try:
            candidates = await (resolver or system_resolver)(host, port)
        except (OSError, UnicodeError) as exc:
            raise ResolutionFailed(f"cannot resolve {host}: {exc}") from None
        if not candidates:
            raise ResolutionFailed(f"cannot resolve {host}: no addresses")
    reasons = []
    allowed = allow if isinstance(allow, tuple) else tuple(allow)
    for candidate in candidates:
        reason = _verdict(candidate, allowed)
        if reason is None:
            return Vetted(ip=candidate.split("%", 1)[0], host=host, port=port, scheme=scheme)
        reasons.append(reason)
    if literal is not None:
        raise BlockedAddress(reasons[0])
    raise BlockedAddress(f"{host} resolves only to blocked addresses: {'; '.join(reasons)}")


def pinned_request(
    client: httpx.AsyncClient,
    url: str | httpx.URL,
    vetted: Vetted,
    body: bytes | None,
    headers: Mapping[str, str],
    timeout: float | httpx.Timeout,
    *,
    method: str = "POST",
) -> httpx.Request:
    """A `method` request (POST of `body` by default) to `vetted.ip` that keeps the URL's
    Host header and TLS SNI."""
    original = url if isinstance(url, httpx.URL) else httpx.URL(url)
    target = original.copy_with(host=vetted.ip)
    merged = {k: v for k, v in headers.items() if k.lower() != "host"}
    merged["Host"] = original.netloc.decode("ascii")
    extensions = {"sni_hostname": vetted.host} if vetted.scheme == "https" else {}
    request = client.build_request(
        method,
        target,
        content=body,
        headers=merged,
        timeout=timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout),
        extensions=extensions,
    )
    request.headers.pop("Cookie", None)
    return request


@functools.lru_cache(maxsize=1024)
def _pinned_target(url: str, ip: str) -> tuple[httpx.URL, str, str | None]:
    """(URL aimed at `ip`, Host header, Basic auth header from the URL's credentials or None);
    parsing a URL costs more than the rest of a request, and a drainer sends to one URL."""
    original = httpx.URL(url)
    auth = None
    if original.username or original.password:
        token = base64.b64encode(f"{original.username}:{original.password}".encode()).decode()
        auth = f"Basic {token}"
    return original.copy_with(host=ip), original.netloc.decode("ascii"), auth


def pinned_post(
    url: str | httpx.URL, vetted: Vetted, body: bytes, headers: Mapping[str, str], timeout: float
) -> httpx.Request:
    """A POST of `body` to `vetted.ip`, keeping the URL's Host header and TLS SNI, built for a
    transport (no client: no cookies, no default headers). Credentials in the URL become Basic
    auth unless `headers` has an Authorization, as httpx's client would do."""
    target, host, auth = _pinned_target(str(url), vetted.ip)
    merged = {k: v for k, v in headers.items() if k.lower() != "host"}
    merged["Host"] = host
    if auth is not None and not any(k.lower() == "authorization" for k in merged):
        merged["Authorization"] = auth
    extensions: dict[str, Any] = {
        "timeout": {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
    }
    if vetted.scheme == "https":
        extensions["sni_hostname"] = vetted.host
    return httpx.Request("POST", target, content=body, headers=merged, extensions=extensions)


def _client_headers() -> httpx.Headers:
    """The headers httpx's client puts first on every request, taken from httpx itself: its
    Accept-Encoding names the decoders it has (br and zstd too where they are installed)."""
    from httpx._client import BaseClient  # no public name; the version is pinned

    return BaseClient().headers


_CLIENT_HEADERS = _client_headers()


@functools.lru_cache(maxsize=256)
def _get_headers(headers: tuple[tuple[str, str], ...], host: str) -> list[tuple[bytes, bytes]]:
    """The head of a GET as an httpx client would send it (its defaults, then `headers`, which
    win over them whatever their case, then Host): a crawl sends the same few heads thousands
    of times, so each is merged once."""
    merged = httpx.Headers(_CLIENT_HEADERS)
    merged.update({k: v for k, v in headers if k.lower() != "host"})
    merged["Host"] = host
    return merged.raw


def pinned_core_get(
    url: httpx.URL, vetted: Vetted, headers: Mapping[str, str], timeout: dict[str, float | None]
) -> httpcore.Request:
    """A GET of `url` to `vetted.ip` as an httpcore request, keeping the URL's Host header and
    TLS SNI, for a HostConnections transport (daemon/net/connections.py): the connection goes to
    the vetted address, the request target and Host header are the URL's. The headers are those
    an httpx client would send, without the client's layers around the exchange (cookies, auth,
    event hooks, redirects), which a fetch of vetted hops does not use, and without an httpx
    Request (a fetch reads the answer from httpcore: daemon/net/answers.py). `timeout` is
    httpcore's extension (`httpx.Timeout.as_dict()`)."""
    raw = _get_headers(tuple(headers.items()), url.netloc.decode("ascii"))
    extensions: dict[str, Any] = {"timeout": timeout}
    if vetted.scheme == "https":
        extensions["sni_hostname"] = vetted.host
    core_url = httpcore.URL(
        scheme=url.raw_scheme, host=vetted.ip.encode("ascii"), port=url.port, target=url.raw_path
    )
    return httpcore.Request(b"GET", core_url, headers=list(raw), extensions=extensions)


def pinned_core_post(
    url: str, vetted: Vetted, body: bytes, headers: Mapping[str, str], timeout: float
) -> httpcore.Request:
    """`pinned_post` as the httpcore request it becomes (same headers, Content-Length as httpx
    adds it, same extensions), built without an httpx Request: the webhook drainer's path."""
    target, host, auth = _pinned_target(url, vetted.ip)
    raw = [(k.encode("ascii"), v.encode("ascii")) for k, v in headers.items()]
    raw = [(k, v) for k, v in raw if k.lower() != b"host"]
    raw.append((b"Host", host.encode("ascii")))
    if auth is not None and not any(k.lower() == b"authorization" for k, _ in raw):
        raw.append((b"Authorization", auth.encode("ascii")))
    if not any(k.lower() == b"content-length" for k, _ in raw):
        length = (b"Content-Length", str(len(body)).encode("ascii"))
        raw = [*raw, length] if body else [length, *raw]  # where httpx puts it
    extensions: dict[str, Any] = {
        "timeout": {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
    }
    if vetted.scheme == "https":
        extensions["sni_hostname"] = vetted.host
    core_url = httpcore.URL(
        scheme=target.raw_scheme, host=target.raw_host, port=target.port, target=target.raw_path
    )
    return httpcore.Request(b"POST", core_url, headers=raw, content=body, extensions=extensions)


class Answer(msgspec.Struct, frozen=True):
    """What the drainer needs from one answer: status, Retry-After, the start of the body."""

    status: int
    retry_after: str | None
    body: bytes
    ip: str
    """The vetted address the request went to."""


async def send_vetted(
    transport: httpx.AsyncBaseTransport,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    allow: Sequence[Network],
    timeout: float,
    *,
    max_body: int = MAX_RESPONSE_BODY,
    cache: VettingCache | None = None,
    now: float = 0.0,
) -> Answer:
    """Vet `url` (or take its address from `cache`, read at monotonic time `now`) and POST
    `body` to the vetted address through `transport` (see `new_transport`): no redirects, no
    cookies, no client layers, one request per call. Through the HostConnections of
    `new_transport` the request is built as httpcore's (`pinned_core_post`) and the answer read
    straight from it: no httpx Request, Response or stream objects per attempt.

    The whole attempt (resolution included) is bounded by `timeout` seconds and raises
    httpx.TimeoutException past it. At most `max_body` raw bytes of the answer are read (a longer
    answer's connection is closed, not reused). Raises BlockedAddress / ResolutionFailed before
    anything is sent, httpx errors after; `error_kind` maps them for `retry.decide`.
    """
    request: httpx.Request | None = None
    with trio.move_on_after(timeout):
        vetted = cache.get(url, allow, now) if cache is not None else None
        if vetted is None:
            vetted = await vet_url(url, allow)
            if cache is not None:
                cache.put(url, allow, vetted, now)
        if isinstance(transport, HostConnections):
            status, retry_after, content = await transport.post(
                pinned_core_post(str(url), vetted, body, headers, timeout), max_body
            )
            return Answer(status, retry_after, content, vetted.ip)
        request = pinned_post(url, vetted, body, headers, timeout)
        response = await transport.handle_async_request(request)
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        try:
            content = b""
            async for chunk in stream:
                content += chunk
                if len(content) >= max_body:
                    break
        finally:
            await stream.aclose()
        return Answer(
            response.status_code, response.headers.get("retry-after"), content[:max_body], vetted.ip
        )
    raise httpx.TimeoutException(f"no answer within {timeout:g} s", request=request)


async def post_vetted(
    client: httpx.AsyncClient,
    url: str | httpx.URL,
    body: bytes,
    headers: Mapping[str, str],
    allow: Sequence[Network],
    timeout: float,
    *,
    max_body: int = MAX_RESPONSE_BODY,
) -> httpx.Response:
    """Like `send_vetted`, through an httpx.AsyncClient (e.g. one from `new_client`), returning
    an httpx.Response holding at most `max_body` bytes of the body, with
    `extensions["vetted_ip"]` saying where the request went."""
    request: httpx.Request | None = None
    with trio.move_on_after(timeout):
        vetted = await vet_url(url, allow)
        request = pinned_request(client, url, vetted, body, headers, timeout)
        response = await client.send(request, follow_redirects=False, stream=True)
        try:
            content = bytearray()
            async for chunk in response.aiter_bytes():
                content += chunk
                if len(content) >= max_body:
                    break
        finally:
            await response.aclose()
        kept = [(k, v) for k, v in response.headers.multi_items() if k not in _REENCODED]
        return httpx.Response(
            response.status_code,
            headers=kept,
            content=bytes(content[:max_body]),
            request=request,
            extensions={"vetted_ip": vetted.ip},
        )
    raise httpx.TimeoutException(f"no answer within {timeout:g} s", request=request)


def error_kind(exc: BaseException) -> str:
    """The `retry.decide` error kind for an exception raised by `post_vetted`."""
    if isinstance(exc, ResolutionFailed):
        return "dns"
    if isinstance(exc, BlockedAddress):
        return "blocked"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    return "network"


def new_client(
    *, max_connections: int = 100, max_keepalive: int = 20, verify: bool = True
) -> httpx.AsyncClient:
    """An AsyncClient fit for `post_vetted`: no redirects, no proxies or .netrc from the
    environment (a proxy would connect on our behalf, unchecked), no cookies kept."""
    return httpx.AsyncClient(
        follow_redirects=False,
        trust_env=False,
        verify=tls.verifying(trust_env=False) if verify is True else verify,
        limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_keepalive
        ),
        cookies=http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[])),
    )


def new_transport(
    *, max_connections: int = 100, verify: ssl.SSLContext | bool = True
) -> HostConnections:
    """Keep-alive connections to ONE destination host for `send_vetted` (see
    daemon/net/connections.py; the caller caps the requests in flight, `max_connections` is how
    many stay open idle): no proxies. `verify=True` uses the process's verifying context
    (daemon/net/tls.py: its first use loads the CA certificates, tens of ms: call it off the event
    loop); `verify=False` skips that for a host that never sees https (should it
    ever, httpcore's default context checks certificates). Close it with `aclose()`."""
    if verify is True:
        context: ssl.SSLContext | None = tls.verifying(trust_env=False)
    else:
        context = verify or None
    return HostConnections(max_idle=max_connections, ssl_context=context)
