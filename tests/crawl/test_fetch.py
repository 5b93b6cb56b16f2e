from __future__ import annotations

import functools
import gzip
import ssl
import zlib
from collections.abc import Callable
from pathlib import Path

import httpcore
import httpx
import pytest
import trio
import trio.testing

from daemon.crawl.fetching.fetch import Fetcher, FetchError, HostGate, accepted_content_type
from daemon.crawl.fetching.urls import CrawlScope
from daemon.fakes.site import SiteSim, host_map_resolver
from daemon.net.origins import OriginConnections

from .conftest import policy

Exchanged = tuple[httpcore.AsyncHTTPConnection, httpcore.Response]


async def test_fetch_page(site: SiteSim, fetcher: Fetcher) -> None:
    result = await fetcher.fetch(site.url("/pages/3"))
    assert result.status_code == 200
    assert result.url == result.requested_url == site.url("/pages/3")
    assert result.content_type.startswith("text/html")
    assert b"<h1>Page 3</h1>" in result.body
    assert result.redirects == []
    assert site.counts["/pages/3"] == 1


async def test_404_and_500_are_results_not_errors(site: SiteSim, fetcher: Fetcher) -> None:
    assert (await fetcher.fetch(site.url("/status/404"))).status_code == 404
    assert (await fetcher.fetch(site.url("/status/500"))).status_code == 500


async def test_redirect_chain_is_followed(site: SiteSim, fetcher: Fetcher) -> None:
    result = await fetcher.fetch(site.url("/redirect/chain/3"))
    assert result.url == site.url("/pages/0")
    assert result.requested_url == site.url("/redirect/chain/3")
    assert result.redirects == [site.url(f"/redirect/chain/{n}") for n in (3, 2, 1)]


async def test_redirect_to_other_host_keeps_host_header(site: SiteSim, fetcher: Fetcher) -> None:
    result = await fetcher.fetch(site.url("/redirect/www"))
    assert result.url == site.url("/pages/1", host="www.site.test")
    assert site.hits[-1].host == "www.site.test"


async def test_redirect_loop(site: SiteSim, fetcher: Fetcher) -> None:
    with pytest.raises(FetchError) as info:
        await fetcher.fetch(site.url("/redirect/loop/a"))
    assert info.value.code == "SCRAPE_SITE_ERROR"
    assert "loop" in info.value.message
    assert site.counts["/redirect/loop/a"] == 1


async def test_too_many_redirects(site: SiteSim) -> None:
    async with Fetcher(policy(max_redirects=2), resolver=host_map_resolver()) as fetcher:
        with pytest.raises(FetchError, match="more than 2 redirects"):
            await fetcher.fetch(site.url("/redirect/chain/5"))
    assert site.counts["/redirect/chain/2"] == 0


async def test_redirect_to_metadata_is_refused_by_decision(
    site: SiteSim, fetcher: Fetcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[str] = []
    real_send = OriginConnections.exchange

    async def spy(self: OriginConnections, request: httpcore.Request) -> Exchanged:
        sent.append(str(request.url))
        return await real_send(self, request)

    monkeypatch.setattr(OriginConnections, "exchange", spy)
    with pytest.raises(FetchError) as info:
        await fetcher.fetch(site.url("/redirect/metadata"))
    assert info.value.code == "CRAWL_DENIAL"
    assert "link-local" in info.value.message
    assert len(sent) == 1 and "169.254" not in sent[0]


async def test_loopback_refused_without_allow_cidrs(site: SiteSim) -> None:
    async with Fetcher(policy(allow_cidrs=()), resolver=host_map_resolver()) as fetcher:
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(site.url("/"))
    assert info.value.code == "CRAWL_DENIAL"
    assert "loopback" in info.value.message
    assert site.hits == []


async def test_check_hop_applies_to_every_hop(site: SiteSim, fetcher: Fetcher) -> None:
    scope = CrawlScope(start_url=site.url("/"))
    with pytest.raises(FetchError) as info:
        await fetcher.fetch(site.url("/redirect/out"), check_hop=scope.refusal)
    assert info.value.code == "CRAWL_DENIAL"
    assert "redirect to http://other.test/landing refused" in info.value.message
    seen: list[str] = []

    def record(url: str) -> str | None:
        seen.append(url)
        return None

    await fetcher.fetch(site.url("/redirect/chain/2"), check_hop=record)
    assert seen == [
        site.url("/redirect/chain/2"),
        site.url("/redirect/chain/1"),
        site.url("/pages/0"),
    ]


async def test_dns_failure(fetcher: Fetcher) -> None:
    with pytest.raises(FetchError) as info:
        await fetcher.fetch("http://unknown.test/")
    assert info.value.code == "SCRAPE_DNS_RESOLUTION_ERROR"


async def test_timeout_bounds_the_whole_fetch(
    site: SiteSim, fetcher: Fetcher, mock_clock: trio.testing.MockClock
) -> None:
    errors: list[FetchError] = []

    async def fetch_slow() -> None:
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(site.url("/slow"), timeout=5.0)
        errors.append(info.value)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(fetch_slow)
        while site.counts["/slow"] == 0:
            await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(5)  # the site would answer after 30 s
    assert [e.code for e in errors] == ["SCRAPE_TIMEOUT"]
    assert "within 5 s" in errors[0].message


async def test_size_cap(site: SiteSim, fetcher: Fetcher) -> None:
    with pytest.raises(FetchError) as info:
        await fetcher.fetch(site.url("/large"))
    assert info.value.code == "SCRAPE_SITE_ERROR"
    assert "size cap" in info.value.message


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("/files/doc.pdf", True),  # files are fetched and read (daemon/crawl/documents/)
        ("/files/image.png", True),  # OCR'd when scraped
        ("/files/clip.mp4", False),
        ("/files/data.json", True),
        ("/files/notes.txt", True),
        ("/sitemap.xml", True),
    ],
)
async def test_content_types(site: SiteSim, fetcher: Fetcher, path: str, ok: bool) -> None:
    site.files["/files/clip.mp4"] = (b"\x00\x00\x00\x18ftypmp42", "video/mp4")
    if ok:
        assert (await fetcher.fetch(site.url(path))).status_code == 200
    else:
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(site.url(path))
        assert info.value.code == "SCRAPE_UNSUPPORTED_FILE_ERROR"


@pytest.mark.parametrize(
    ("content_type", "ok"),
    [
        ("text/html; charset=utf-8", True),
        ("TEXT/PLAIN", True),
        ("application/json", True),
        ("application/ld+json", True),
        ("application/xml", True),
        ("application/atom+xml", True),
        ("", True),
        ("application/pdf", True),
        ("image/png", True),
        ("application/octet-stream", True),
        ("application/vnd.openxmlformats-officedocument.wordprocessingml.document", True),
        ("application/vnd.oasis.opendocument.spreadsheet", True),
        ("image/gif", False),
        ("video/mp4", False),
        ("application/zip", False),
        ("font/woff2", False),
    ],
)
def test_accepted_content_type(content_type: str, ok: bool) -> None:
    assert accepted_content_type(content_type) is ok


async def test_tls_error(fetcher: Fetcher) -> None:
    # A plain-TCP listener that closes at once: the TLS handshake fails.
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def handler(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\n\r\nnot tls")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(f"https://site.test:{port}/")
        nursery.cancel_scope.cancel()
    assert info.value.code == "SCRAPE_SSL_ERROR"


async def test_user_agent_and_caller_headers(
    site: SiteSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[httpx.Headers] = []
    vetted: list[bytes] = []
    real_send = OriginConnections.exchange

    async def spy(self: OriginConnections, request: httpcore.Request) -> Exchanged:
        sent.append(httpx.Headers(request.headers))
        vetted.append(request.url.host)
        return await real_send(self, request)

    monkeypatch.setattr(OriginConnections, "exchange", spy)
    async with Fetcher(policy(), resolver=host_map_resolver()) as fetcher:
        await fetcher.fetch(
            site.url("/redirect/www"),
            headers={"Authorization": "Bearer x", "X-Custom": "1", "Host": "evil.test"},
        )
    first, second = sent
    assert first["user-agent"] == "crawld-test FirecrawlAgent"
    assert first["accept"] == "*/*"  # as an httpx client sends it
    assert first["accept-encoding"] == "gzip, deflate"
    assert "cookie" not in first
    assert first["host"] == f"site.test:{site.port}"
    assert vetted == [b"127.0.0.1", b"127.0.0.1"]  # where it goes: the vetted address
    assert first["authorization"] == "Bearer x"
    assert second["host"] == f"www.site.test:{site.port}"
    assert "authorization" not in second  # dropped across origins
    assert second["x-custom"] == "1"


async def test_host_gate_limits_concurrency(autojump_clock: trio.abc.Clock) -> None:
    gate = HostGate(per_host=3)
    peak = {"a": 0, "b": 0}
    active = {"a": 0, "b": 0}

    async def worker(host: str, concurrency: int | None) -> None:
        async with gate.slot(host, concurrency=concurrency):
            active[host] += 1
            peak[host] = max(peak[host], active[host])
            await trio.sleep(1)
            active[host] -= 1

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(worker, "a", None)
            nursery.start_soon(worker, "b", 2)
    assert peak == {"a": 3, "b": 2}
    assert gate.active("a") == 0


async def test_host_gate_delay_spaces_starts(autojump_clock: trio.abc.Clock) -> None:
    gate = HostGate(per_host=4)
    starts: list[float] = []
    other: list[float] = []
    t0 = trio.current_time()

    async def worker(host: str, out: list[float]) -> None:
        async with gate.slot(host, concurrency=1, delay=2.0):
            out.append(trio.current_time() - t0)

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(worker, "a", starts)
        nursery.start_soon(worker, "b", other)
    assert [round(s, 6) for s in starts] == [0.0, 2.0, 4.0, 6.0]
    assert [round(s, 6) for s in other] == [0.0]  # another host is not delayed


async def test_gate_applies_to_fetches(site: SiteSim) -> None:
    gate = HostGate(per_host=1)
    async with (
        Fetcher(policy(), resolver=host_map_resolver(), gate=gate) as fetcher,
        trio.open_nursery() as nursery,
    ):
        for i in range(4):
            nursery.start_soon(fetcher.fetch, site.url(f"/pages/{i}"))
    assert gate.active("site.test") == 0
    assert sum(site.counts[f"/pages/{i}"] for i in range(4)) == 4


async def test_resolutions_are_cached_and_still_vetted(site: SiteSim) -> None:
    calls: list[str] = []
    table = {"site.test": "127.0.0.1", "evil.test": "169.254.169.254"}

    async def resolve(host: str, port: int) -> list[str]:
        calls.append(host)
        return await host_map_resolver(table)(host, port)

    async with Fetcher(policy(), resolver=resolve) as fetcher:
        for path in ("/pages/1", "/pages/2", "/pages/3"):
            await fetcher.fetch(site.url(path))
        for _ in range(2):
            with pytest.raises(FetchError) as info:
                await fetcher.fetch(f"http://evil.test:{site.port}/")
            assert info.value.code == "CRAWL_DENIAL"
    assert calls == ["site.test", "evil.test"]


async def test_outcomes_are_counted(site: SiteSim, fetcher: Fetcher) -> None:
    from daemon.crawl.fetching.fetch import fetches

    ok = fetches.labels("ok")._value.get()
    unsupported = fetches.labels("SCRAPE_UNSUPPORTED_FILE_ERROR")._value.get()
    site.files["/files/clip.mp4"] = (b"\x00\x00\x00\x18ftypmp42", "video/mp4")
    await fetcher.fetch(site.url("/about"))
    with pytest.raises(FetchError):
        await fetcher.fetch(site.url("/files/clip.mp4"))
    assert fetches.labels("ok")._value.get() == ok + 1
    assert fetches.labels("SCRAPE_UNSUPPORTED_FILE_ERROR")._value.get() == unsupported + 1


async def _serve_raw(nursery: trio.Nursery, answer: bytes, heads: list[bytes] | None = None) -> int:
    """A one-shot HTTP server that writes `answer` verbatim and closes the connection; the
    request heads it read go to `heads`."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")

    async def handler(stream: trio.SocketStream) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += await stream.receive_some(65536)
        if heads is not None:
            heads.append(head)
        await stream.send_all(answer)
        await stream.aclose()

    nursery.start_soon(trio.serve_listeners, handler, listeners)
    return int(listeners[0].socket.getsockname()[1])


async def _refused_raw(fetcher: Fetcher, answer: bytes) -> FetchError:
    """The FetchError of a fetch from a server answering `answer` verbatim."""
    async with trio.open_nursery() as nursery:
        port = await _serve_raw(nursery, answer)
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(f"http://site.test:{port}/")
        nursery.cancel_scope.cancel()
    return info.value


async def test_connection_cut_mid_body_is_an_error(fetcher: Fetcher) -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 1000\r\n\r\n<p>only part"
    )
    error = await _refused_raw(fetcher, answer)
    assert error.code == "SCRAPE_SITE_ERROR"


async def test_chunked_body_cut_is_an_error(fetcher: Fetcher) -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n"
    )
    error = await _refused_raw(fetcher, answer)
    assert error.code == "SCRAPE_SITE_ERROR"


async def test_gzip_bomb_hits_the_size_cap(fetcher: Fetcher) -> None:
    bomb = gzip.compress(b"<p>" + b"a" * 4_000_000)
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\n"
        + f"Content-Length: {len(bomb)}\r\n\r\n".encode()
        + bomb
    )
    assert len(bomb) < 32 * 1024  # under the cap compressed, far over it decompressed
    assert "size cap" in (await _refused_raw(fetcher, answer)).message


async def test_direct_get_on_the_wire(fetcher: Fetcher) -> None:
    """The head of a direct hop's GET, byte for byte: an httpx client's default headers, the
    policy's, then the caller's (which replace a default of the same name whatever its case);
    Host first, with the URL's name, while the connection goes to the vetted address."""
    heads: list[bytes] = []
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 2\r\n"
        b"Connection: close\r\n\r\nhi"
    )
    async with trio.open_nursery() as nursery:
        port = await _serve_raw(nursery, answer, heads)
        await fetcher.fetch(
            f"http://site.test:{port}/a%20b/c?q=1&x=%C3%A9#frag",
            headers={"X-Custom": "v", "accept": "text/html"},
        )
        await fetcher.fetch(f"http://site.test:{port}/p")
        nursery.cancel_scope.cancel()
    host = f"Host: site.test:{port}".encode()
    assert heads == [
        b"GET /a%20b/c?q=1&x=%C3%A9 HTTP/1.1\r\n" + host + b"\r\nConnection: keep-alive\r\n"
        b"User-Agent: crawld-test FirecrawlAgent\r\nAccept-Encoding: gzip, deflate\r\n"
        b"X-Custom: v\r\naccept: text/html\r\n\r\n",
        b"GET /p HTTP/1.1\r\n" + host + b"\r\nAccept: */*\r\nConnection: keep-alive\r\n"
        b"User-Agent: crawld-test FirecrawlAgent\r\nAccept-Encoding: gzip, deflate\r\n\r\n",
    ]


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate, gzip", lambda b: gzip.compress(zlib.compress(b))),
        ("identity", lambda b: b),
        ("x-unknown", lambda b: b),
    ],
)
async def test_bodies_are_decoded_and_headers_joined(
    fetcher: Fetcher, coding: str, encode: Callable[[bytes], bytes]
) -> None:
    body = encode(b"<p>decoded</p>")
    answer = (
        f"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: {coding}\r\n"
        f"X-Seen: 1\r\nx-seen: 2\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    async with trio.open_nursery() as nursery:
        port = await _serve_raw(nursery, answer)
        result = await fetcher.fetch(f"http://site.test:{port}/")
        nursery.cancel_scope.cancel()
    assert result.body == b"<p>decoded</p>"
    assert result.headers == {
        "content-type": "text/html",
        "content-encoding": coding,
        "x-seen": "1, 2",
        "content-length": str(len(body)),
    }


async def test_a_corrupt_encoding_is_an_error(fetcher: Fetcher) -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: 9\r\n\r\nnot gzip!"
    )
    error = await _refused_raw(fetcher, answer)
    assert error.code == "SCRAPE_SITE_ERROR"
    assert "DecodingError" in error.message


async def test_a_declared_length_over_the_cap_is_refused_unread(fetcher: Fetcher) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 40000\r\n\r\n"
    async with trio.open_nursery() as nursery:
        port = await _serve_raw(nursery, answer)
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(f"http://site.test:{port}/")
        nursery.cancel_scope.cancel()
    assert "size cap (32768 bytes)" in info.value.message


def test_policy_from_config() -> None:
    from daemon.crawl.config import CrawlConfig
    from daemon.crawl.fetching.fetch import FetchPolicy

    config = CrawlConfig(allow_cidrs=["127.0.0.0/8"], max_bytes=4096)
    fetch_policy = FetchPolicy.from_config(config)
    assert fetch_policy.allow_cidrs == ("127.0.0.0/8",)
    assert fetch_policy.max_bytes == 4096
    assert fetch_policy.user_agent == config.user_agent
    assert fetch_policy.timeout == float(config.page_timeout)
    assert fetch_policy.max_redirects == 10


async def test_waiting_for_the_host_is_not_page_time(
    site: SiteSim, mock_clock: trio.testing.MockClock
) -> None:
    """Virtual time stands still unless jumped: 10 s pass while the only slot of the host is
    taken, then the page is fetched within its 5 s budget."""
    gate = HostGate(per_host=1)
    results: list[int] = []
    async with Fetcher(policy(), resolver=host_map_resolver(), gate=gate) as fetcher:

        async def fetch_one() -> None:
            results.append((await fetcher.fetch(site.url("/about"), timeout=5.0)).status_code)

        async with trio.open_nursery() as nursery, gate.slot("site.test"):
            nursery.start_soon(fetch_one)
            await trio.testing.wait_all_tasks_blocked()
            mock_clock.jump(10)
            await trio.testing.wait_all_tasks_blocked()
            assert results == [] and site.counts["/about"] == 0
    assert results == [200]


async def test_errors_redact_and_cap_urls(fetcher: Fetcher) -> None:
    url = "http://user:pw@169.254.169.254/" + "p" * 500 + "?token=secret"
    with pytest.raises(FetchError) as info:
        await fetcher.fetch(url)
    message = info.value.message
    assert "secret" not in message and "pw" not in message
    assert "more characters" in message and len(message) < 400
    assert info.value.url == url  # the caller's own value, for matching


async def _serve_tls(nursery: trio.Nursery, tmp_path: Path, names: list[str | None]) -> int:
    """An HTTPS server with a self-signed certificate for site.test; records the SNI of each
    TLS connection and keeps connections alive."""
    from tests.jobs.test_ssrf import make_cert

    cert, key = make_cert(tmp_path, "site.test")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    server_ctx.sni_callback = lambda _sock, name, _ctx: names.append(name)  # type: ignore[assignment,misc]
    page = b"<p>secure</p>"

    async def handle(raw: trio.SocketStream) -> None:
        stream = trio.SSLStream(raw, server_ctx, server_side=True)
        try:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    data += chunk
                _, data = data.split(b"\r\n\r\n", 1)
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                    + f"Content-Length: {len(page)}\r\n\r\n".encode()
                    + page
                )
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return

    listeners = await nursery.start(functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    return int(listeners[0].socket.getsockname()[1])


async def test_https_certificate_verified_unless_skipped(
    tmp_path: Path, fetcher: Fetcher, nursery: trio.Nursery
) -> None:
    names: list[str | None] = []
    port = await _serve_tls(nursery, tmp_path, names)
    with pytest.raises(FetchError) as info:
        await fetcher.fetch(f"https://site.test:{port}/")
    assert info.value.code == "SCRAPE_SSL_ERROR"
    result = await fetcher.fetch(f"https://site.test:{port}/", skip_tls_verification=True)
    assert result.body == b"<p>secure</p>"
    assert names[-1] == "site.test"


async def test_https_hosts_on_one_address_get_their_own_connections(
    tmp_path: Path, fetcher: Fetcher, nursery: trio.Nursery
) -> None:
    names: list[str | None] = []
    port = await _serve_tls(nursery, tmp_path, names)
    for host in ("site.test", "www.site.test", "site.test", "www.site.test"):
        await fetcher.fetch(f"https://{host}:{port}/", skip_tls_verification=True)
    # One TLS connection per name (kept alive and reused), never one name's for the other.
    assert names == ["site.test", "www.site.test"]


async def test_host_gate_forgets_idle_hosts(autojump_clock: trio.abc.Clock) -> None:
    gate = HostGate(per_host=2)
    for i in range(3000):
        async with gate.slot(f"h{i}.test", delay=1.0):
            pass
    assert len(gate) == 3000  # every delay is still pending: all kept
    await trio.sleep(61)
    async with gate.slot("last.test", delay=1.0):
        pass
    assert len(gate) == 1
    async with gate.slot("plain.test"):
        assert len(gate) == 2
    assert len(gate) == 1  # no delay: forgotten as soon as idle


@pytest.mark.parametrize(
    ("status", "headers", "any_type", "outcome"),
    [
        (301, {"location": " /b "}, False, "http://s.test/b"),
        (307, {"location": "https://o.test/x"}, False, "https://o.test/x"),
        (304, {"location": "/b"}, False, None),  # not a redirect: its body is read
        (302, {}, False, None),
        (200, {"content-type": "text/html; charset=utf-8"}, False, None),
        (200, {"content-type": "video/mp4"}, False, "SCRAPE_UNSUPPORTED_FILE_ERROR"),
        (200, {"content-type": "video/mp4"}, True, None),
        (200, {"content-length": "101"}, False, "SCRAPE_SITE_ERROR"),
        (200, {"content-length": "101", "content-encoding": "gzip"}, False, None),
        (200, {"content-length": "100"}, False, None),
    ],
)
def test_redirect_or_refusal(
    status: int, headers: dict[str, str], any_type: bool, outcome: str | None
) -> None:
    from daemon.crawl.fetching.fetch_rules import redirect_or_refusal

    if outcome is not None and outcome.startswith("SCRAPE_"):
        with pytest.raises(FetchError) as info:
            redirect_or_refusal(status, headers, "http://s.test/", "http://s.test/a", any_type, 100)
        assert info.value.code == outcome
    else:
        found = redirect_or_refusal(
            status, headers, "http://s.test/", "http://s.test/a", any_type, 100
        )
        assert found == outcome
