from __future__ import annotations

import ipaddress
import os
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from daemon.fakes.receiver import WebhookReceiver, open_receiver
from daemon.net.ssrf import (
    BlockedAddress,
    ResolutionFailed,
    Vetted,
    VettingCache,
    error_kind,
    is_blocked,
    new_client,
    new_transport,
    parse_networks,
    pinned_core_post,
    pinned_post,
    pinned_request,
    post_vetted,
    send_vetted,
    vet_url,
)
from tests.jobs.conftest import FakeResolver

LOOPBACK = parse_networks(["127.0.0.0/8"])


def teredo(client: str) -> str:
    server = int(ipaddress.IPv4Address("65.54.227.120"))
    obfuscated = ~int(ipaddress.IPv4Address(client)) & 0xFFFFFFFF
    return str(ipaddress.IPv6Address((0x20010000 << 96) | (server << 64) | obfuscated))


@pytest.mark.parametrize(
    ("ip", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.0.0.2", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "CGNAT"),
        ("100.127.255.254", "CGNAT"),
        ("169.254.169.254", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "broadcast"),
        ("198.18.0.1", "benchmarking"),
        ("192.0.0.8", "IETF"),
        ("192.0.2.1", "documentation"),
        ("203.0.113.7", "documentation"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("::ffff:127.0.0.1", "IPv4-mapped form of loopback"),
        ("::ffff:7f00:1", "IPv4-mapped form of loopback"),
        ("::ffff:a9fe:a9fe", "IPv4-mapped form of link-local"),
        ("::ffff:10.0.0.1", "IPv4-mapped form of private"),
        ("::127.0.0.1", "IPv4-compatible form of loopback"),
        ("::8.8.8.8", "deprecated IPv4-compatible"),
        ("2002:7f00:1::", "6to4 form of loopback"),
        ("2002:a9fe:a9fe::1", "6to4 form of link-local"),
        ("64:ff9b::127.0.0.1", "NAT64 form of loopback"),
        ("64:ff9b::a9fe:a9fe", "NAT64 form of link-local"),
        ("64:ff9b:1::1", "local-use NAT64"),
        (teredo("127.0.0.1"), "Teredo form of loopback"),
        ("fe80::1", "link-local"),
        ("fe80::1%2", "link-local"),
        ("fc00::1", "unique local"),
        ("fd12:3456::1", "unique local"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "documentation"),
        ("100::1", "discard-only"),
        ("::ffff:0:7f00:1", "IPv4-translated"),
        ("::ffff:0:808:808", "IPv4-translated"),
        ("::ffff:0:0:0", "IPv4-translated"),
        ("5f00::1", "SRv6"),
        ("5f00:ffff:1::8", "SRv6"),
    ],
)
def test_blocked_addresses(ip: str, reason: str) -> None:
    got = is_blocked(ip)
    assert got is not None and reason in got


@pytest.mark.parametrize(
    "ip",
    [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.216.34",
        "100.63.255.255",
        "100.128.0.1",
        "172.32.0.1",
        "::ffff:8.8.8.8",
        "2002:808:808::1",
        "64:ff9b::808:808",
        "2606:4700:4700::1111",
        "2a00:1450:4001:80b::200e",
        "5f01::1",
    ],
)
def test_public_addresses_pass(ip: str) -> None:
    assert is_blocked(ip) is None


@pytest.mark.parametrize(
    ("ip", "allow", "blocked"),
    [
        ("127.0.0.1", ["127.0.0.0/8"], False),
        ("127.9.9.9", ["127.0.0.0/8"], False),
        ("127.0.0.1", ["127.0.0.1/32"], False),
        ("127.0.0.2", ["127.0.0.1/32"], True),
        ("::ffff:127.0.0.1", ["127.0.0.0/8"], False),
        ("::1", ["127.0.0.0/8"], True),
        ("::1", ["::1/128"], False),
        ("10.0.0.1", ["127.0.0.0/8"], True),
        ("169.254.169.254", ["127.0.0.0/8"], True),
        ("100.64.1.1", ["100.64.0.0/10"], False),
        ("fd00::5", ["fd00::/8"], False),
        ("fd00::5", ["10.0.0.0/8"], True),
    ],
)
def test_allow_list(ip: str, allow: list[str], blocked: bool) -> None:
    assert (is_blocked(ip, parse_networks(allow)) is not None) is blocked


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:8080/hook", "loopback address 127.0.0.1"),
        ("http://169.254.169.254/latest/meta-data/", "link-local address 169.254.169.254"),
        ("http://[::ffff:127.0.0.1]/", "IPv4-mapped form of loopback"),
        ("http://[::ffff:a9fe:a9fe]/", "IPv4-mapped form of link-local"),
        ("https://[::1]:8443/", "loopback address ::1"),
        ("http://10.0.0.5/", "private address 10.0.0.5"),
        ("http://100.64.0.1/", "CGNAT"),
        ("http://0.0.0.0:80/", "unspecified"),
        ("http://2130706433/", "loopback address 127.0.0.1"),
        ("http://0x7f.1/", "loopback address 127.0.0.1"),
        ("http://127.1/", "loopback address 127.0.0.1"),
        ("ftp://93.184.216.34/", "scheme 'ftp' is not allowed"),
        ("file:///etc/passwd", "scheme 'file' is not allowed"),
        ("gopher://example.com/", "scheme 'gopher' is not allowed"),
        ("http:///nohost", "no host"),
    ],
)
async def test_vet_url_refuses(url: str, reason: str) -> None:
    with pytest.raises(BlockedAddress) as caught:
        await vet_url(url)
    assert reason in caught.value.reason
    assert not isinstance(caught.value, ResolutionFailed)


async def test_loopback_allowed_with_allow_list() -> None:
    vetted = await vet_url("http://127.0.0.1:8080/hook", LOOPBACK)
    assert vetted == Vetted(ip="127.0.0.1", host="127.0.0.1", port=8080, scheme="http")


async def test_localhost_resolves_to_loopback_and_is_refused() -> None:
    with pytest.raises(BlockedAddress, match="localhost resolves only to blocked addresses"):
        await vet_url("http://localhost:9/")
    allowed = await vet_url("http://localhost:9/", parse_networks(["127.0.0.0/8", "::1/128"]))
    assert ipaddress.ip_address(allowed.ip).is_loopback


async def test_names_resolving_to_blocked_addresses(resolver: FakeResolver) -> None:
    with pytest.raises(BlockedAddress, match=r"rebind\.test resolves only to blocked"):
        await vet_url("https://rebind.test/x")
    with pytest.raises(BlockedAddress, match=r"link-local address 169\.254\.169\.254"):
        await vet_url("http://metadata.test/")


async def test_blocked_resolutions_are_dropped_and_a_public_one_used(
    resolver: FakeResolver,
) -> None:
    vetted = await vet_url("https://mixed.test/hook")
    assert vetted == Vetted(ip="93.184.216.34", host="mixed.test", port=443, scheme="https")


async def test_unresolvable_name_fails_closed(resolver: FakeResolver) -> None:
    with pytest.raises(ResolutionFailed, match=r"cannot resolve nowhere\.test") as caught:
        await vet_url("http://nowhere.test/")
    assert isinstance(caught.value, BlockedAddress)
    assert error_kind(caught.value) == "dns"


async def test_remembered_verdicts_follow_the_allow_list() -> None:
    """Verdicts are remembered per (address, allow list): asking again with another list, or
    none, gives that list's answer, as the first time."""
    loopback = tuple(parse_networks(["127.0.0.0/8"]))
    for _ in range(2):
        assert (await vet_url("http://127.0.0.1:8080/", loopback)).ip == "127.0.0.1"
        with pytest.raises(BlockedAddress, match=r"loopback address 127\.0\.0\.1"):
            await vet_url("http://127.0.0.1:8080/")
        with pytest.raises(BlockedAddress, match="loopback"):
            await vet_url("http://[::1]/", loopback)  # the list's network is IPv4 only
        assert (await vet_url("http://[::ffff:127.0.0.1]/", loopback)).ip == "::ffff:7f00:1"


async def test_literal_ip_is_not_resolved(resolver: FakeResolver) -> None:
    await vet_url("http://93.184.216.34/")
    assert resolver.asked == []


def test_pinned_request_keeps_host_and_sni() -> None:
    client = httpx.AsyncClient()
    vetted = Vetted(ip="93.184.216.34", host="hooks.example.com", port=8443, scheme="https")
    request = pinned_request(
        client,
        "https://user:pw@hooks.example.com:8443/in?x=1",
        vetted,
        b"{}",
        {"host": "evil", "X-A": "1"},
        5.0,
    )
    assert str(request.url) == "https://user:pw@93.184.216.34:8443/in?x=1"
    assert request.headers["Host"] == "hooks.example.com:8443"
    assert request.headers.get_list("Host") == ["hooks.example.com:8443"]
    assert request.headers["X-A"] == "1"
    assert request.extensions["sni_hostname"] == "hooks.example.com"
    assert request.extensions["timeout"]["read"] == 5.0

    v6 = Vetted(ip="2606:4700::1", host="h.test", port=80, scheme="http")
    plain = pinned_request(client, "http://h.test/p", v6, b"{}", {}, 1.0)
    assert str(plain.url) == "http://[2606:4700::1]/p"
    assert plain.headers["Host"] == "h.test"
    assert "sni_hostname" not in plain.extensions


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with open_receiver() as rx:
        yield rx


async def test_post_vetted_reaches_receiver_with_host_preserved(
    receiver: WebhookReceiver, resolver: FakeResolver
) -> None:
    url = f"http://hooks.test:{receiver.port}/in"
    body = b'{"id":"j","seq":1,"eventId":"j:1","type":"crawl.started"}'
    async with new_client() as client:
        response = await post_vetted(client, url, body, {"webhook-id": "w1"}, LOOPBACK, timeout=5.0)
    assert response.status_code == 200
    assert response.content == b'{"ok":true}'
    assert response.extensions["vetted_ip"] == "127.0.0.1"
    [got] = receiver.requests
    assert got.path == "/in"
    assert got.body == body
    assert got.headers["host"] == f"hooks.test:{receiver.port}"
    assert got.headers["webhook-id"] == "w1"
    assert "cookie" not in got.headers


async def test_post_vetted_refuses_before_sending(
    receiver: WebhookReceiver, resolver: FakeResolver
) -> None:
    async with new_client() as client:
        with pytest.raises(BlockedAddress) as caught:
            await post_vetted(client, receiver.url(), b"{}", {}, [], timeout=5.0)
        with pytest.raises(BlockedAddress):
            await post_vetted(client, f"http://hooks.test:{receiver.port}/", b"{}", {}, [], 5.0)
    assert error_kind(caught.value) == "blocked"
    assert receiver.requests == []


async def test_post_vetted_does_not_follow_redirects(receiver: WebhookReceiver) -> None:
    receiver.fail_next(1, 307)
    async with new_client() as client:
        response = await post_vetted(client, receiver.url(), b"{}", {}, LOOPBACK, 5.0)
    assert response.status_code == 307
    assert len(receiver.requests) == 1


async def test_post_vetted_caps_the_response_body(receiver: WebhookReceiver) -> None:
    async with new_client() as client:
        response = await post_vetted(client, receiver.url(), b"{}", {}, LOOPBACK, 5.0, max_body=4)
    assert response.content == b'{"ok'


async def test_post_vetted_times_out(receiver: WebhookReceiver) -> None:
    receiver.delay_next(1, 1.0)
    async with new_client() as client:
        with trio.fail_after(2):
            with pytest.raises(httpx.TimeoutException) as caught:
                await post_vetted(client, receiver.url(), b"{}", {}, LOOPBACK, timeout=0.05)
    assert error_kind(caught.value) == "timeout"


async def test_post_vetted_connection_refused(receiver: WebhookReceiver) -> None:
    await receiver.die()
    async with new_client() as client:
        with pytest.raises(httpx.ConnectError) as caught:
            await post_vetted(client, receiver.url(), b"{}", {}, LOOPBACK, timeout=2.0)
    assert error_kind(caught.value) == "connect"


def test_error_kind_of_other_failures() -> None:
    assert error_kind(httpx.RemoteProtocolError("closed")) == "network"
    assert error_kind(httpx.ReadError("reset")) == "network"
    assert error_kind(httpx.ConnectTimeout("slow")) == "timeout"


def make_cert(tmp_path: Path, name: str) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("openssl is required under CI=true (TLS/SNI test)", pytrace=False)
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


async def tls_server(
    nursery: trio.Nursery, cert: Path, key: Path, seen: list[tuple[str | None, bytes]]
) -> int:
    """A one-answer-per-connection HTTPS server recording (SNI, Host) per request; its port."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    names: list[str | None] = []

    def remember_sni(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        names.append(name)

    server_ctx.sni_callback = remember_sni

    async def handle(raw: trio.SocketStream) -> None:
        stream = trio.SSLStream(raw, server_ctx, server_side=True)
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some(65536)
        except trio.BrokenResourceError:
            return  # the client refused our certificate
        host = next(
            line.split(b":", 1)[1].strip()
            for line in data.split(b"\r\n")
            if line.lower().startswith(b"host:")
        )
        seen.append((names[-1] if names else None, host))
        await stream.send_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        await stream.aclose()

    listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    return int(listeners[0].socket.getsockname()[1])


@pytest.mark.parametrize("through", ["client", "transport"])
async def test_https_keeps_sni_and_verifies_the_name(
    tmp_path: Path, resolver: FakeResolver, nursery: trio.Nursery, through: str
) -> None:
    cert, key = make_cert(tmp_path, "hooks.test")
    seen: list[tuple[str | None, bytes]] = []
    port = await tls_server(nursery, cert, key, seen)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    url = f"https://hooks.test:{port}/in"
    if through == "client":
        async with httpx.AsyncClient(verify=client_ctx, trust_env=False) as client:
            response = await post_vetted(client, url, b"{}", {}, LOOPBACK, timeout=5.0)
        status = response.status_code
    else:  # the webhook drainer's way: send_vetted over a host's own connections
        async with new_transport(verify=client_ctx) as transport:
            status = (await send_vetted(transport, url, b"{}", {}, LOOPBACK, 5.0)).status
    assert status == 204
    assert seen == [("hooks.test", f"hooks.test:{port}".encode())]


async def test_a_certificate_for_another_name_is_refused(
    tmp_path: Path, resolver: FakeResolver, nursery: trio.Nursery
) -> None:
    cert, key = make_cert(tmp_path, "other.test")  # trusted, but not for hooks.test
    seen: list[tuple[str | None, bytes]] = []
    port = await tls_server(nursery, cert, key, seen)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    async with new_transport(verify=client_ctx) as transport:
        with pytest.raises(httpx.ConnectError) as caught:
            await send_vetted(transport, f"https://hooks.test:{port}/in", b"{}", {}, LOOPBACK, 5.0)
    assert error_kind(caught.value) == "connect"
    causes: list[BaseException] = []
    cause: BaseException | None = caught.value
    while cause is not None:
        causes.append(cause)
        cause = cause.__cause__ or cause.__context__
    assert any(isinstance(c, ssl.SSLCertVerificationError) for c in causes), causes
    assert seen == []


def test_vetting_cache_keeps_an_address_for_its_ttl() -> None:
    cache = VettingCache(ttl=30, max_entries=2)
    vetted = Vetted(ip="93.184.216.34", host="h.test", port=443, scheme="https")
    url = "https://h.test/in"
    assert cache.get(url, [], 0.0) is None
    cache.put(url, [], vetted, 100.0)
    assert cache.get(url, [], 129.9) == vetted
    assert cache.get(url, LOOPBACK, 110.0) is None  # another allow list vets again
    assert cache.get("https://h.test/other", [], 110.0) is None
    assert cache.get(url, [], 130.0) is None  # expired, and dropped
    assert len(cache) == 0
    for i in range(3):
        cache.put(f"https://h{i}.test/", [], vetted, 0.0)
    assert len(cache) <= 2 and cache.get("https://h2.test/", [], 1.0) == vetted


async def test_send_vetted_resolves_once_per_ttl_and_stays_pinned(
    receiver: WebhookReceiver, resolver: FakeResolver
) -> None:
    url = f"http://hooks.test:{receiver.port}/in"
    cache = VettingCache(ttl=30)
    async with new_transport() as client:
        for now in (0.0, 10.0, 29.0):
            answer = await send_vetted(client, url, b"{}", {}, LOOPBACK, 5.0, cache=cache, now=now)
            assert (answer.status, answer.ip) == (200, "127.0.0.1")
        assert resolver.asked == ["hooks.test"]
        resolver.table["hooks.test"] = ["10.0.0.9"]  # rebinding: seen once the entry expires
        with pytest.raises(BlockedAddress, match=r"private address 10\.0\.0\.9"):
            await send_vetted(client, url, b"{}", {}, LOOPBACK, 5.0, cache=cache, now=31.0)
        assert resolver.asked == ["hooks.test", "hooks.test"]
        with pytest.raises(BlockedAddress):  # a refusal is not cached
            await send_vetted(client, url, b"{}", {}, LOOPBACK, 5.0, cache=cache, now=32.0)
    assert len(receiver.requests) == 3
    assert all(r.headers["host"] == f"hooks.test:{receiver.port}" for r in receiver.requests)


def test_a_missing_openssl_fails_under_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="openssl is required under CI=true"):
        make_cert(tmp_path, "hooks.test")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        make_cert(tmp_path, "hooks.test")


def test_pinned_post_keeps_host_and_sni_and_turns_credentials_into_basic_auth() -> None:
    vetted = Vetted(ip="93.184.216.34", host="hooks.example.com", port=8443, scheme="https")
    request = pinned_post(
        "https://user:p%40ss@hooks.example.com:8443/in?x=1",
        vetted,
        b"{}",
        {"host": "evil", "X-A": "1"},
        5.0,
    )
    assert request.url.host == "93.184.216.34" and request.url.raw_path == b"/in?x=1"
    assert request.headers.get_list("Host") == ["hooks.example.com:8443"]
    assert request.headers["Authorization"] == "Basic dXNlcjpwQHNz"  # user:p@ss
    assert request.headers["Content-Length"] == "2" and "Cookie" not in request.headers
    assert request.extensions["sni_hostname"] == "hooks.example.com"
    assert request.extensions["timeout"]["read"] == 5.0
    own = pinned_post("https://u:p@h.test/", vetted, b"", {"Authorization": "Bearer t"}, 1.0)
    assert own.headers.get_list("Authorization") == ["Bearer t"]


@pytest.mark.parametrize(
    ("url", "headers"),
    [
        ("https://user:p%40ss@hooks.example.com:8443/in?x=1", {"host": "evil", "X-A": "1"}),
        ("https://u:p@h.test/", {"Authorization": "Bearer t"}),
        ("http://127.0.0.1:8080/hook", {"webhook-id": "w", "Content-Type": "application/json"}),
        ("http://[::1]:8080/h?q=%20", {"X-Own-Length": "9", "authorization": "x"}),
    ],
)
def test_pinned_core_post_is_the_request_pinned_post_becomes(
    url: str, headers: dict[str, str]
) -> None:
    # The drainer's lean path must put on the wire what the httpx path did (HostConnections
    # turns pinned_post's request into this same httpcore request).
    vetted = Vetted(ip="93.184.216.34", host="hooks.example.com", port=8443, scheme="https")
    if url.startswith("http:"):
        vetted = Vetted(ip="127.0.0.1", host="127.0.0.1", port=8080, scheme="http")
    for body in (b"", b'{"x":1}'):
        lean = pinned_core_post(url, vetted, body, headers, 5.0)
        via = pinned_post(url, vetted, body, headers, 5.0)
        assert lean.method == b"POST"
        assert (lean.url.scheme, lean.url.host, lean.url.port, lean.url.target) == (
            via.url.raw_scheme,
            via.url.raw_host,
            via.url.port,
            via.url.raw_path,
        )
        assert lean.headers == via.headers.raw
        assert lean.extensions == via.extensions
        assert b"".join(lean.stream) == body  # type: ignore[union-attr]


def test_pinned_core_post_refuses_a_header_httpx_refuses() -> None:
    vetted = Vetted(ip="127.0.0.1", host="127.0.0.1", port=8080, scheme="http")
    with pytest.raises(UnicodeEncodeError):
        pinned_post("http://127.0.0.1:8080/", vetted, b"", {"X-A": "café"}, 1.0)
    with pytest.raises(UnicodeEncodeError):
        pinned_core_post("http://127.0.0.1:8080/", vetted, b"", {"X-A": "café"}, 1.0)


async def test_send_vetted_reads_a_capped_answer(
    receiver: WebhookReceiver,
) -> None:
    async with new_transport() as transport:
        first = await send_vetted(transport, receiver.url(), b"{}", {}, LOOPBACK, 5.0, max_body=4)
        receiver.fail_next(1, 429, retry_after=7)
        second = await send_vetted(transport, receiver.url(), b"{}", {}, LOOPBACK, 5.0)
    assert (first.status, first.body, first.ip) == (200, b'{"ok', "127.0.0.1")
    assert (second.status, second.retry_after, second.body) == (429, "7", b'{"ok":false}')
    assert len(receiver.requests) == 2
