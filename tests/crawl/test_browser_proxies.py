"""The browser's way out through `[crawl] proxies`: the vetting SOCKS5 proxy vets the target, then
chains to the upstream proxy (HTTP CONNECT or SOCKS5 with the vetted name, credentials from the
environment). First with a hand-made SOCKS5 client, then with a real Chromium."""

from __future__ import annotations

import base64
import functools
import ssl
import struct
from pathlib import Path
from typing import Any

import pytest
import trio

from daemon.crawl.fetching.proxy import REP_NOT_ALLOWED, REP_OK, REP_REFUSED, VettingProxy
from daemon.crawl.fetching.upstream import (
    TunnelFailed,
    connect_request,
    connect_status,
    open_tunnel,
)
from daemon.crawl.proxies import Proxies, ProxyServer, Upstream
from daemon.crawl.rendering.browser import BrowserPool
from daemon.crawl.rendering.render import RenderSpec, render
from daemon.fakes.forward_proxy import ForwardProxy, serve_forward_proxy
from daemon.fakes.site import HOSTS, SiteSim, host_map_resolver
from tests.crawl.conftest import browser_config

ENV = {"PX_USER": "alice", "PX_PASS": "s3cr3t-pw"}
AUTH = "Basic " + base64.b64encode(b"alice:s3cr3t-pw").decode()


async def start_fwd(nursery: trio.Nursery, **kw: object) -> ForwardProxy:
    proxy = ForwardProxy(hosts=dict.fromkeys(HOSTS, "127.0.0.1"), **kw)  # type: ignore[arg-type]
    await nursery.start(functools.partial(serve_forward_proxy, proxy))
    return proxy


def pools(basic: list[str], stealth: list[str] = (), auth: bool = False) -> Proxies:  # type: ignore[assignment]
    def server(url: str) -> ProxyServer:
        if auth:
            return ProxyServer(url=url, username_env="PX_USER", password_env="PX_PASS")
        return ProxyServer(url=url)

    return Proxies.from_servers([server(u) for u in basic], [server(u) for u in stealth],
                                "per_host", ENV)  # fmt: skip


async def start_vetting(
    nursery: trio.Nursery, upstream: Proxies, allow: tuple[str, ...] = ("127.0.0.0/8",)
) -> VettingProxy:
    vetting = VettingProxy(allow_cidrs=allow, resolver=host_map_resolver(), upstream=upstream)
    await nursery.start(vetting.run)
    return vetting


async def socks_get(port: int, host: str, target_port: int, path: str) -> tuple[int, bytes]:
    """What a browser does: SOCKS5 CONNECT by name, then a plain GET; (reply code, answer)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"\x05\x01\x00")
        assert await stream.receive_some(2) == b"\x05\x00"
        name = host.encode()
        await stream.send_all(b"\x05\x01\x00\x03" + bytes([len(name)]) + name
                              + struct.pack("!H", target_port))  # fmt: skip
        head = b""
        while len(head) < 10:
            chunk = await stream.receive_some(10 - len(head))
            if not chunk:
                break
            head += chunk
        if len(head) < 2 or head[1] != REP_OK:
            return (head[1] if len(head) > 1 else -1), b""
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nHost: {host}:{target_port}\r\nConnection: close\r\n\r\n".encode()
        )
        answer = b""
        while chunk := await stream.receive_some(65536):
            answer += chunk
        return REP_OK, answer


# -- rules -------------------------------------------------------------------------------------


def test_connect_request_carries_the_name_and_credentials() -> None:
    up = Upstream.of(
        ProxyServer(url="http://p.example:3128", username_env="PX_USER", password_env="PX_PASS"),
        "basic",
        ENV,
    )
    text = connect_request(up, "site.test", 443).decode()
    assert text.startswith("CONNECT site.test:443 HTTP/1.1\r\nHost: site.test:443\r\n")
    assert f"Proxy-Authorization: {AUTH}\r\n\r\n" in text
    bare = Upstream.of(ProxyServer(url="http://p.example:3128"), "basic", {})
    assert "Proxy-Authorization" not in connect_request(bare, "::1", 80).decode()
    assert connect_request(bare, "::1", 80).startswith(b"CONNECT [::1]:80 ")
    assert connect_status(b"HTTP/1.1 200 Connection established") == 200
    assert connect_status(b"HTTP/1.0 407 Proxy Authentication Required") == 407
    assert connect_status(b"SSH-2.0-OpenSSH") is None


# -- the vetting proxy chained to an upstream ---------------------------------------------------


async def test_vetting_proxy_chains_to_an_http_proxy_with_credentials(
    site: SiteSim, nursery: trio.Nursery
) -> None:
    fwd = await start_fwd(nursery, username="alice", password="s3cr3t-pw")
    upstream = pools([fwd.url], auth=True)
    vetting = await start_vetting(nursery, upstream)
    rep, answer = await socks_get(vetting.port, "site.test", site.port, "/pages/2")
    assert rep == REP_OK and b"<h1>Page 2</h1>" in answer
    assert [(c.kind, c.target, c.authorization) for c in fwd.carried] == [
        ("connect", f"site.test:{site.port}", AUTH)
    ]
    assert upstream.status()["basic"][0]["outcomes"] == {"ok": 1}


async def test_vetting_proxy_chains_to_a_socks5_proxy(site: SiteSim, nursery: trio.Nursery) -> None:
    fwd = await start_fwd(nursery, username="alice", password="s3cr3t-pw")
    vetting = await start_vetting(nursery, pools([f"socks5://127.0.0.1:{fwd.port}"], auth=True))
    rep, answer = await socks_get(vetting.port, "site.test", site.port, "/pages/3")
    assert rep == REP_OK and b"<h1>Page 3</h1>" in answer
    assert [(c.kind, c.target, c.authorization) for c in fwd.carried] == [
        ("socks", f"site.test:{site.port}", "alice:s3cr3t-pw")
    ]


async def test_stealth_listener_uses_the_stealth_pool(site: SiteSim, nursery: trio.Nursery) -> None:
    basic, stealth = await start_fwd(nursery), await start_fwd(nursery)
    vetting = await start_vetting(nursery, pools([basic.url], [stealth.url]))
    assert (await socks_get(vetting.stealth_port, "site.test", site.port, "/pages/1"))[0] == REP_OK
    assert (await socks_get(vetting.port, "www.site.test", site.port, "/pages/1"))[0] == REP_OK
    assert [c.target for c in stealth.carried] == [f"site.test:{site.port}"]
    assert [c.target for c in basic.carried] == [f"www.site.test:{site.port}"]


async def test_private_target_is_refused_before_the_upstream(
    site: SiteSim, nursery: trio.Nursery
) -> None:
    fwd = await start_fwd(nursery)
    vetting = await start_vetting(nursery, pools([fwd.url]), allow=())
    rep, _ = await socks_get(vetting.port, "site.test", site.port, "/pages/1")
    assert rep == REP_NOT_ALLOWED
    rep, _ = await socks_get(vetting.port, "169.254.169.254", 80, "/")
    assert rep == REP_NOT_ALLOWED
    assert fwd.carried == [] and site.counts["/pages/1"] == 0


async def test_upstream_down_or_refusing_fails_the_connection(
    site: SiteSim, nursery: trio.Nursery
) -> None:
    fwd = await start_fwd(nursery, username="alice", password="other")
    upstream = pools([fwd.url], auth=True)
    vetting = await start_vetting(nursery, upstream)
    rep, _ = await socks_get(vetting.port, "site.test", site.port, "/pages/1")
    assert rep == REP_REFUSED
    assert [c.allowed for c in fwd.carried] == [False]
    assert upstream.status()["basic"][0]["outcomes"] == {"SCRAPE_SITE_ERROR": 1}
    assert site.counts["/pages/1"] == 0


# -- a real Chromium ----------------------------------------------------------------------------


@pytest.mark.browser
async def test_rendered_pages_leave_through_the_configured_proxies(
    site: SiteSim, nursery: trio.Nursery
) -> None:
    basic = await start_fwd(nursery, username="alice", password="s3cr3t-pw")
    stealth = await start_fwd(nursery)
    upstream = pools([basic.url], [stealth.url], auth=True)
    vetting = await start_vetting(nursery, upstream)
    pool = BrowserPool(browser_config(), lambda: vetting.port, lambda: vetting.closed_port,
                       stealth_port=lambda: vetting.stealth_port)  # fmt: skip
    await nursery.start(pool.run)
    rendered = await render(pool, site.url("/pages/1"), RenderSpec(timeout=30))
    assert "Page 1" in rendered.result.body.decode()
    assert rendered.result.proxy_used == "basic"
    assert f"site.test:{site.port}" in {c.target for c in basic.carried}
    assert {c.authorization for c in basic.carried} == {AUTH}
    hidden = await render(pool, site.url("/pages/2"), RenderSpec(timeout=30, stealth=True))
    assert "Page 2" in hidden.result.body.decode() and hidden.result.proxy_used == "stealth"
    assert f"site.test:{site.port}" in {c.target for c in stealth.carried}
    # Every page the site served came through one of the two proxies.
    assert len(basic.carried) + len(stealth.carried) >= 2
    assert all(c.kind == "connect" for c in basic.carried + stealth.carried)


@pytest.mark.browser
async def test_auto_renders_again_through_the_stealth_pool_after_a_403(
    site: SiteSim, nursery: trio.Nursery
) -> None:
    from daemon.crawl.content.document import DocumentOptions, scrape_page
    from daemon.crawl.fetching.fetch import Fetcher, FetchResult
    from daemon.crawl.options.models import ScrapeOptions
    from daemon.crawl.runs.pages import PageMaker, page_plan

    from .conftest import policy

    basic, stealth = await start_fwd(nursery), await start_fwd(nursery)
    upstream = pools([basic.url], [stealth.url])
    vetting = await start_vetting(nursery, upstream)
    # A context per page: a reused tab would carry /pages/1 on the 403 page's kept-alive
    # connection, and the count below is of connections.
    pool = BrowserPool(browser_config(pages_per_context=1), lambda: vetting.port,
                       lambda: vetting.closed_port, stealth_port=lambda: vetting.stealth_port)  # fmt: skip
    await nursery.start(pool.run)

    async def document(
        result: FetchResult, options: DocumentOptions, url: str
    ) -> tuple[dict[str, Any], list[str]]:
        return scrape_page(result, options, source_url=url, scrape_id="t")

    async with Fetcher(policy(), resolver=host_map_resolver(), proxies=upstream) as fetcher:
        maker = PageMaker(fetcher, document, browser=pool, render_mode="always")
        forbidden = await maker.produce(site.url("/status/403"), page_plan(ScrapeOptions(), 30))
        fine = await maker.produce(site.url("/pages/1"), page_plan(ScrapeOptions(), 30))
    meta = forbidden.document["metadata"]
    assert (meta["engine"], meta["statusCode"], meta["proxyUsed"]) == ("browser", 403, "stealth")
    assert fine.document["metadata"]["proxyUsed"] == "basic"
    target = f"site.test:{site.port}"
    assert [c.target for c in basic.carried].count(target) >= 2  # 403 page, then /pages/1
    assert target in {c.target for c in stealth.carried}
    assert site.counts["/status/403"] == 2


async def test_tunnel_through_an_https_proxy(
    site: SiteSim, nursery: trio.Nursery, tmp_path: Path
) -> None:
    from tests.jobs.test_ssrf import make_cert

    cert, key = make_cert(tmp_path, "localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    fwd = await start_fwd(nursery, tls=server_ctx, username="alice", password="s3cr3t-pw")
    up = Upstream.of(
        ProxyServer(url=f"https://localhost:{fwd.port}", username_env="PX_USER",
                    password_env="PX_PASS"),
        "basic", ENV,
    )  # fmt: skip
    with pytest.raises(TunnelFailed):  # the proxy's certificate is verified
        await open_tunnel(up, "site.test", site.port)
    trusted = ssl.create_default_context(cafile=str(cert))
    stream = await open_tunnel(up, "site.test", site.port, ssl_context=trusted)
    async with stream:
        await stream.send_all(
            b"GET /pages/5 HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n"
        )
        answer = b""
        while chunk := await stream.receive_some(65536):
            answer += chunk
    assert b"<h1>Page 5</h1>" in answer
    assert [(c.kind, c.target, c.authorization) for c in fwd.carried] == [
        ("connect", f"site.test:{site.port}", AUTH)
    ]
