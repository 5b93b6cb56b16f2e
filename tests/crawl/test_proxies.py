"""Outbound proxies: the pure rules (config, rotation, `proxy` option) and the fetcher through the
recording forward proxy (daemon/fakes/forward_proxy.py)."""

from __future__ import annotations

import base64
import functools
import json
import socket
from pathlib import Path

import pytest
import trio

from daemon.config import ConfigError
from daemon.crawl.fetching.fetch import Fetcher, FetchError
from daemon.crawl.proxies import Proxies, ProxyServer, Upstream, proxy_problems
from daemon.fakes.forward_proxy import ForwardProxy, serve_forward_proxy
from daemon.fakes.site import HOSTS, SiteSim, host_map_resolver
from daemon.metrics import REGISTRY
from daemon.settings import decode

from .conftest import policy
from .test_fetch import _serve_tls

ENV = {"PX_USER": "alice", "PX_PASS": "s3cr3t-pw"}


async def start_proxy(nursery: trio.Nursery, **kw: object) -> ForwardProxy:
    proxy = ForwardProxy(hosts=dict.fromkeys(HOSTS, "127.0.0.1"), **kw)  # type: ignore[arg-type]
    await nursery.start(functools.partial(serve_forward_proxy, proxy))
    return proxy


def server(url: str, *, auth: bool = False, name: str = "") -> ProxyServer:
    if auth:
        return ProxyServer(url=url, username_env="PX_USER", password_env="PX_PASS", name=name)
    return ProxyServer(url=url, name=name)


def fetcher_through(
    basic: list[ProxyServer],
    stealth: list[ProxyServer] | None = None,
    rotation: str = "per_host",
    **overrides: object,
) -> Fetcher:
    proxies = Proxies.from_servers(basic, stealth or [], rotation, ENV)  # type: ignore[arg-type]
    return Fetcher(policy(**overrides), resolver=host_map_resolver(), proxies=proxies)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- rules -------------------------------------------------------------------------------------


def test_config_problems_name_the_key_path() -> None:
    servers = [
        ProxyServer(url="http://proxy.example:3128"),
        ProxyServer(url="http://bob:pw@proxy.example:3128"),
        ProxyServer(url="ftp://proxy.example:21"),
        ProxyServer(url="http://proxy.example"),
        ProxyServer(url="socks5://s.example:1080", username_env="NOPE_UNSET"),
    ]
    problems = proxy_problems(servers, "$.crawl.proxies", environ={})
    assert problems[0].startswith("credentials do not belong in the file")
    assert problems[0].endswith("at `$.crawl.proxies[1].url`")
    assert "pw" not in problems[0]
    assert problems[1].endswith("at `$.crawl.proxies[2].url`")
    assert "explicit port" in problems[2] and problems[2].endswith("`$.crawl.proxies[3].url`")
    assert "'NOPE_UNSET' is not set" in problems[3]
    assert problems[3].endswith("`$.crawl.proxies[4].username_env`")


def test_config_file_refuses_credentials_in_the_url() -> None:
    text = '[crawl]\nproxies = [{url = "http://p.example:1"}, {url = "http://u:p@p.example:2"}]\n'
    with pytest.raises(ConfigError, match=r"\$\.crawl\.proxies\[1\]\.url"):
        decode(text)
    ok = decode('[crawl]\nproxy_rotation = "per_request"\nproxies = [{url = "socks5://p:1"}]\n')
    assert ok.crawl.proxy_rotation == "per_request"


def test_config_toml_documents_the_proxy_options() -> None:
    text = Path(__file__).parents[2].joinpath("config.toml").read_text()
    for key in ("proxies", "stealth_proxies", "proxy_rotation", "username_env"):
        assert key in text


def test_per_host_rotation_is_stable_and_spreads() -> None:
    ups = [Upstream.of(ProxyServer(url=f"http://p{i}.example:1"), "basic", {}) for i in range(3)]
    proxies = Proxies(ups, rotation="per_host")
    hosts = [f"h{i}.example" for i in range(60)]
    first = {h: proxies.pick("basic", h) for h in hosts}
    assert all(proxies.pick("basic", h) == first[h] for h in hosts for _ in range(3))
    assert len({u.name for u in first.values() if u}) == 3


def test_per_request_rotation_goes_round() -> None:
    ups = [Upstream.of(ProxyServer(url=f"http://p{i}.example:1"), "basic", {}) for i in range(3)]
    proxies = Proxies(ups, rotation="per_request")
    picked = [proxies.pick("basic", "one.example") for _ in range(6)]
    assert [u.name for u in picked if u] == [u.name for u in ups] * 2


def test_proxy_option_mapping() -> None:
    up = Upstream.of(ProxyServer(url="http://p.example:1"), "basic", {})
    st = Upstream.of(ProxyServer(url="http://s.example:1"), "stealth", {})
    both = Proxies([up], [st])
    assert both.attempts(None) == both.attempts("auto") == ["basic", "stealth"]
    assert both.attempts("basic") == ["basic"]
    assert both.attempts("stealth") == both.attempts("enhanced") == ["stealth"]
    basic_only = Proxies([up])
    assert basic_only.attempts("stealth") == basic_only.attempts("auto") == ["basic"]
    stealth_only = Proxies(stealth=[st])
    assert stealth_only.pick("basic", "x.example") is None  # basic = direct
    assert stealth_only.attempts("auto") == ["basic", "stealth"]


def test_upstream_keeps_credentials_out_of_its_url_and_repr() -> None:
    up = Upstream.of(server("http://p.example:3128", auth=True), "basic", ENV)
    assert up.authorization() == "Basic " + base64.b64encode(b"alice:s3cr3t-pw").decode()
    shown = json.dumps(Proxies([up]).status()) + repr(up) + up.url + up.name
    assert "s3cr3t-pw" not in shown and "alice" not in shown


# -- through the recording proxy ---------------------------------------------------------------


@pytest.fixture
async def fwd(nursery: trio.Nursery) -> ForwardProxy:
    return await start_proxy(nursery)


async def test_http_page_goes_through_the_proxy_in_absolute_form(
    site: SiteSim, fwd: ForwardProxy
) -> None:
    async with fetcher_through([server(fwd.url)]) as fetcher:
        result = await fetcher.fetch(site.url("/pages/3"))
    assert result.status_code == 200 and b"<h1>Page 3</h1>" in result.body
    assert result.proxy == f"http://127.0.0.1:{fwd.port}" and result.proxy_used == "basic"
    assert [(c.kind, c.target) for c in fwd.carried] == [("forward", site.url("/pages/3"))]
    assert site.hits[-1].host == "site.test"


async def test_https_page_goes_through_a_connect_tunnel_with_the_name(
    tmp_path: Path, fwd: ForwardProxy, nursery: trio.Nursery
) -> None:
    names: list[str | None] = []
    port = await _serve_tls(nursery, tmp_path, names)
    async with fetcher_through([server(fwd.url)]) as fetcher:
        with pytest.raises(FetchError) as info:  # the certificate is still verified end to end
            await fetcher.fetch(f"https://site.test:{port}/")
        assert info.value.code == "SCRAPE_SSL_ERROR"
        result = await fetcher.fetch(f"https://site.test:{port}/", skip_tls_verification=True)
    assert result.body == b"<p>secure</p>"
    assert {(c.kind, c.target) for c in fwd.carried} == {("connect", f"site.test:{port}")}
    assert names[-1] == "site.test"  # SNI carries the name through the tunnel


async def test_credentials_are_sent_to_the_proxy_and_never_shown(
    site: SiteSim, nursery: trio.Nursery
) -> None:
    fwd = await start_proxy(nursery, username="alice", password="s3cr3t-pw")
    async with fetcher_through([server(fwd.url, auth=True)]) as fetcher:
        result = await fetcher.fetch(site.url("/pages/1"))
        status = json.dumps(fetcher.proxies.status())
    assert result.status_code == 200
    expected = "Basic " + base64.b64encode(b"alice:s3cr3t-pw").decode()
    assert [c.authorization for c in fwd.carried] == [expected]
    assert "Proxy-Authorization" not in str(site.hits[-1])
    assert "s3cr3t-pw" not in status and '"auth": true' in status
    assert '"ok": 1' in status
    # Wrong credentials: Firecrawl's site error, naming the proxy, not the secret.
    wrong = Proxies.from_servers(
        [server(fwd.url, auth=True)], [], "per_host", {**ENV, "PX_PASS": "nope"}
    )
    async with Fetcher(policy(), resolver=host_map_resolver(), proxies=wrong) as fetcher:
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(site.url("/pages/2"))
    assert info.value.code == "SCRAPE_SITE_ERROR" and "407" in info.value.message
    assert "nope" not in info.value.message and "alice" not in info.value.message


async def test_socks5_proxy_with_credentials_gets_the_name(
    site: SiteSim, nursery: trio.Nursery
) -> None:
    fwd = await start_proxy(nursery, username="alice", password="s3cr3t-pw")
    socks = server(f"socks5://127.0.0.1:{fwd.port}", auth=True)
    async with fetcher_through([socks]) as fetcher:
        result = await fetcher.fetch(site.url("/pages/4"))
    assert b"<h1>Page 4</h1>" in result.body
    assert [(c.kind, c.target, c.authorization) for c in fwd.carried] == [
        ("socks", f"site.test:{site.port}", "alice:s3cr3t-pw")
    ]


async def test_private_target_is_refused_before_the_proxy_sees_anything(
    site: SiteSim, fwd: ForwardProxy
) -> None:
    # No allow_cidrs: site.test resolves to 127.0.0.1, which the guard refuses. The proxy
    # itself is on loopback too: that is the operator's setting and is not vetted.
    async with fetcher_through([server(fwd.url)], allow_cidrs=()) as fetcher:
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(site.url("/pages/1"))
        assert info.value.code == "CRAWL_DENIAL"
        with pytest.raises(FetchError) as meta:
            await fetcher.fetch("http://169.254.169.254/latest/meta-data/")
        assert meta.value.code == "CRAWL_DENIAL"
    assert fwd.carried == []
    assert site.counts["/pages/1"] == 0


async def test_redirect_hops_are_vetted_before_the_proxy_carries_them(
    site: SiteSim, fwd: ForwardProxy
) -> None:
    async with fetcher_through([server(fwd.url)]) as fetcher:
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(site.url("/redirect/metadata"))
    assert info.value.code == "CRAWL_DENIAL"
    assert [c.target for c in fwd.carried] == [site.url("/redirect/metadata")]


async def test_per_host_rotation_keeps_a_site_on_one_proxy(
    site: SiteSim, nursery: trio.Nursery
) -> None:
    proxies = [await start_proxy(nursery) for _ in range(2)]
    hosts = ["site.test", "www.site.test", "blog.site.test"]
    async with fetcher_through([server(p.url) for p in proxies]) as fetcher:
        for i in range(4):
            for host in hosts:
                await fetcher.fetch(site.url(f"/pages/{i}", host=host))
    for host in hosts:
        carriers = [n for n, p in enumerate(proxies) for c in p.carried if f"//{host}:" in c.target]
        assert len(carriers) == 4 and len(set(carriers)) == 1, host


async def test_per_request_rotation_alternates(site: SiteSim, nursery: trio.Nursery) -> None:
    proxies = [await start_proxy(nursery) for _ in range(2)]
    async with fetcher_through([server(p.url) for p in proxies], rotation="per_request") as f:
        for i in range(6):
            await f.fetch(site.url(f"/pages/{i}"))
    assert [len(p.carried) for p in proxies] == [3, 3]


async def test_a_proxy_that_is_down_is_the_pages_site_error(site: SiteSim) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    async with fetcher_through([server(down)]) as fetcher:
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(site.url("/pages/1"))
        status = fetcher.proxies.status()
    assert info.value.code == "SCRAPE_SITE_ERROR"
    assert "cannot connect to proxy http://127.0.0.1:" in info.value.message
    assert status["basic"][0]["outcomes"] == {"SCRAPE_SITE_ERROR": 1}
    assert site.counts["/pages/1"] == 0
    sample = REGISTRY.get_sample_value(
        "crawld_crawl_proxy_requests_total",
        {"proxy": down, "pool": "basic", "outcome": "SCRAPE_SITE_ERROR"},
    )
    assert sample == 1


async def test_auto_retries_a_blocked_answer_through_the_stealth_pool(
    site: SiteSim, nursery: trio.Nursery
) -> None:
    blocked = await start_proxy(nursery, block_status=403)
    stealth = await start_proxy(nursery)
    async with fetcher_through([server(blocked.url)], [server(stealth.url)]) as fetcher:
        auto = await fetcher.fetch(site.url("/pages/5"))
        basic = await fetcher.fetch(site.url("/pages/6"), proxy="basic")
        direct_stealth = await fetcher.fetch(site.url("/pages/7"), proxy="stealth")
    assert (auto.status_code, auto.proxy_used) == (200, "stealth")
    assert (basic.status_code, basic.proxy_used) == (403, "basic")
    assert (direct_stealth.status_code, direct_stealth.proxy_used) == (200, "stealth")
    assert [c.target for c in blocked.carried] == [site.url("/pages/5"), site.url("/pages/6")]
    assert [c.target for c in stealth.carried] == [site.url("/pages/5"), site.url("/pages/7")]
    assert site.counts["/pages/6"] == 0


async def test_no_proxies_means_direct(site: SiteSim) -> None:
    async with Fetcher(policy(), resolver=host_map_resolver()) as fetcher:
        result = await fetcher.fetch(site.url("/pages/1"), proxy="stealth")
    assert (result.proxy, result.proxy_used) == ("", "basic")


async def test_https_proxy_with_its_own_ca(
    site: SiteSim, nursery: trio.Nursery, tmp_path: Path
) -> None:
    import ssl

    from tests.jobs.test_ssrf import make_cert

    cert, key = make_cert(tmp_path, "localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    fwd = await start_proxy(nursery, tls=server_ctx, username="alice", password="s3cr3t-pw")
    url = f"https://localhost:{fwd.port}"
    problems = proxy_problems(
        [ProxyServer(url=url, ca_file=str(tmp_path / "missing.pem"))], "$.crawl.proxies", ENV
    )
    assert problems == [
        f"{str(tmp_path / 'missing.pem')!r} is not a file - at `$.crawl.proxies[0].ca_file`"
    ]
    untrusted = ProxyServer(url=url, username_env="PX_USER", password_env="PX_PASS")
    async with fetcher_through([untrusted]) as fetcher:
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(site.url("/pages/1"))
    assert (
        info.value.code == "SCRAPE_SSL_ERROR" and "proxy https://localhost:" in info.value.message
    )
    trusted = ProxyServer(url=url, username_env="PX_USER", password_env="PX_PASS",
                          ca_file=str(cert))  # fmt: skip
    async with fetcher_through([trusted]) as fetcher:
        result = await fetcher.fetch(site.url("/pages/1"))
    assert b"<h1>Page 1</h1>" in result.body
    assert [(c.kind, c.target) for c in fwd.carried] == [("forward", site.url("/pages/1"))]
    assert fwd.carried[0].authorization == "Basic " + base64.b64encode(b"alice:s3cr3t-pw").decode()
