from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from daemon.crawl.fetch import Fetcher, FetchError, HostGate, accepted_content_type
from daemon.crawl.urls import CrawlScope
from daemon.fakes.site import SiteSim, host_map_resolver

from .conftest import policy


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
    real_send = httpx.AsyncClient.send

    async def spy(self: httpx.AsyncClient, request: httpx.Request, **kw: Any) -> httpx.Response:
        sent.append(str(request.url))
        return await real_send(self, request, **kw)

    monkeypatch.setattr(httpx.AsyncClient, "send", spy)
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


async def test_timeout_bounds_the_whole_fetch(site: SiteSim, fetcher: Fetcher) -> None:
    with pytest.raises(FetchError) as info:
        await fetcher.fetch(site.url("/slow"), timeout=0.2)
    assert info.value.code == "SCRAPE_TIMEOUT"


async def test_size_cap(site: SiteSim, fetcher: Fetcher) -> None:
    with pytest.raises(FetchError) as info:
        await fetcher.fetch(site.url("/large"))
    assert info.value.code == "SCRAPE_SITE_ERROR"
    assert "size cap" in info.value.message


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("/files/doc.pdf", False),
        ("/files/image.png", False),
        ("/files/data.json", True),
        ("/files/notes.txt", True),
        ("/sitemap.xml", True),
    ],
)
async def test_content_types(site: SiteSim, fetcher: Fetcher, path: str, ok: bool) -> None:
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
        ("application/pdf", False),
        ("image/png", False),
        ("application/octet-stream", False),
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
    sent: list[httpx.Request] = []
    real_send = httpx.AsyncClient.send

    async def spy(self: httpx.AsyncClient, request: httpx.Request, **kw: Any) -> httpx.Response:
        sent.append(request)
        return await real_send(self, request, **kw)

    monkeypatch.setattr(httpx.AsyncClient, "send", spy)
    async with Fetcher(policy(), resolver=host_map_resolver()) as fetcher:
        await fetcher.fetch(
            site.url("/redirect/www"),
            headers={"Authorization": "Bearer x", "X-Custom": "1", "Host": "evil.test"},
        )
    first, second = sent
    assert first.headers["user-agent"] == "crawld-test FirecrawlAgent"
    assert first.headers["host"] == f"site.test:{site.port}"
    assert first.headers["authorization"] == "Bearer x"
    assert second.headers["host"] == f"www.site.test:{site.port}"
    assert "authorization" not in second.headers  # dropped across origins
    assert second.headers["x-custom"] == "1"


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
