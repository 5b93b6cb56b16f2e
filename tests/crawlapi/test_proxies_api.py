"""A whole crawld with `[crawl] proxies` and `stealth_proxies` pointing at recording forward
proxies: scrape, crawl and batch pages go through them (`metadata.proxyUsed`), credentials come
from the environment and appear in no answer, /status or log, and /metrics counts per proxy."""

from __future__ import annotations

import base64
import functools
import logging
from typing import Any

import httpx
import msgspec
import pytest
import trio

from daemon.crawl.proxies import ProxyServer
from daemon.fakes.forward_proxy import ForwardProxy, serve_forward_proxy
from daemon.fakes.site import HOSTS, SiteSim
from tests.conftest import unlabelled

from .conftest import CONFIG, wait_finished

SECRET = "pr0xy-s3cret"


@pytest.fixture
async def basic(nursery: trio.Nursery) -> ForwardProxy:
    proxy = ForwardProxy(hosts=dict.fromkeys(HOSTS, "127.0.0.1"), username="crawler",
                         password=SECRET)  # fmt: skip
    await nursery.start(functools.partial(serve_forward_proxy, proxy))
    return proxy


@pytest.fixture
async def stealth(nursery: trio.Nursery) -> ForwardProxy:
    proxy = ForwardProxy(hosts=dict.fromkeys(HOSTS, "127.0.0.1"))
    await nursery.start(functools.partial(serve_forward_proxy, proxy))
    return proxy


@pytest.fixture
def crawl_config(
    basic: ForwardProxy, stealth: ForwardProxy, monkeypatch: pytest.MonkeyPatch
) -> str:
    monkeypatch.setenv("TEST_PROXY_USER", "crawler")
    monkeypatch.setenv("TEST_PROXY_PASS", SECRET)
    return CONFIG + (
        f'proxies = [{{ url = "{basic.url}", username_env = "TEST_PROXY_USER", '
        f'password_env = "TEST_PROXY_PASS", name = "corp" }}]\n'
        f'stealth_proxies = [{{ url = "{stealth.url}", name = "resi" }}]\n'
    )


def _auth() -> str:
    return "Basic " + base64.b64encode(f"crawler:{SECRET}".encode()).decode()


async def test_scrape_crawl_and_batch_go_through_the_proxy(
    client: httpx.AsyncClient,
    site: SiteSim,
    basic: ForwardProxy,
    stealth: ForwardProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    scraped = (await client.post("/v2/scrape", json={"url": site.url("/pages/1")})).json()
    assert scraped["success"] is True
    assert scraped["data"]["metadata"]["proxyUsed"] == "basic"
    assert "warning" not in scraped["data"] or "proxy" not in scraped["data"]["warning"]

    body = {"url": site.url("/chain/0"), "sitemap": "skip", "includePaths": ["^/chain/"],
            "crawlEntireDomain": True,
            "limit": 4}  # fmt: skip
    job = (await client.post("/v2/crawl", json=body)).json()["id"]
    assert await wait_finished(client, job) == "completed"
    crawled = (await client.get(f"/v2/crawl/{job}")).json()["data"]
    assert len(crawled) == 4 and {d["metadata"]["proxyUsed"] for d in crawled} == {"basic"}

    urls = [site.url(f"/pages/{i}") for i in (10, 11, 12)]
    batch = (await client.post("/v2/batch/scrape", json={"urls": urls})).json()["id"]
    assert await wait_finished(client, batch, "batch") == "completed"

    carried = {c.target for c in basic.carried}
    assert site.url("/pages/1") in carried
    assert {site.url(f"/chain/{i}") for i in range(4)} <= carried
    assert set(urls) <= carried
    assert {c.authorization for c in basic.carried} == {_auth()}
    assert stealth.carried == []
    # Every page the site saw came through the proxy (robots.txt included).
    assert len(site.hits) == len(basic.carried)

    status = (await client.get("/status")).text
    assert SECRET not in status and '"name":"corp"' in status.replace(" ", "")
    proxies = (await client.get("/status")).json()["crawl"]["proxies"]
    assert proxies["rotation"] == "per_host"
    assert proxies["basic"][0]["requests"] == len(basic.carried)
    metrics = unlabelled((await client.get("/metrics")).text)
    assert 'crawld_crawl_proxy_requests_total{outcome="ok",pool="basic",proxy="corp"}' in metrics
    logged = "\n".join(r.getMessage() + str(r.__dict__) for r in caplog.records)
    assert SECRET not in logged and _auth() not in logged


async def test_stealth_and_auto_use_the_second_pool(
    client: httpx.AsyncClient, site: SiteSim, basic: ForwardProxy, stealth: ForwardProxy
) -> None:
    basic.block_status = 403
    auto = (await client.post("/v2/scrape", json={"url": site.url("/pages/2")})).json()
    assert auto["data"]["metadata"]["statusCode"] == 200
    assert auto["data"]["metadata"]["proxyUsed"] == "stealth"
    plain = (await client.post("/v2/scrape", json={"url": site.url("/pages/3"),
                                                   "proxy": "basic"})).json()  # fmt: skip
    assert plain["data"]["metadata"]["statusCode"] == 403
    assert plain["data"]["metadata"]["proxyUsed"] == "basic"
    chosen = (await client.post("/v2/scrape", json={"url": site.url("/pages/4"),
                                                    "proxy": "enhanced"})).json()  # fmt: skip
    assert chosen["data"]["metadata"]["proxyUsed"] == "stealth"
    assert "warning" not in chosen["data"]  # honoured: no "ignored" warning
    assert [c.target for c in stealth.carried] == [site.url("/pages/2"), site.url("/pages/4")]
    bad = await client.post("/v2/scrape", json={"url": site.url("/"), "proxy": "turbo"})
    assert bad.status_code == 400 and "proxy" in bad.text


async def test_private_target_is_refused_before_the_proxy(
    client: httpx.AsyncClient, basic: ForwardProxy
) -> None:
    answer = await client.post("/v2/scrape", json={"url": "http://169.254.169.254/latest/"})
    assert answer.status_code == 403 and "link-local" in answer.json()["error"]
    assert basic.carried == []


async def test_a_proxy_that_is_down_gives_the_pages_error(
    client: httpx.AsyncClient, site: SiteSim, basic: ForwardProxy, daemon: Any
) -> None:
    service = daemon.parts["crawl"]
    config = service.config
    dead = trio.socket.socket()
    await dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    down = msgspec.structs.replace(config, proxies=[ProxyServer(url=f"http://127.0.0.1:{port}")],
                                   stealth_proxies=[])  # fmt: skip
    service.configure(down)
    answer = await client.post("/v2/scrape", json={"url": site.url("/pages/5")})
    body = answer.json()
    assert answer.status_code == 500 and body["success"] is False
    assert body["code"] == "SCRAPE_SITE_ERROR"
    assert "cannot connect to proxy" in body["error"]
    assert site.counts["/pages/5"] == 0


async def test_a_crawl_through_a_dead_proxy_lists_each_pages_error(
    client: httpx.AsyncClient, site: SiteSim, daemon: Any
) -> None:
    service = daemon.parts["crawl"]
    dead = trio.socket.socket()
    await dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    service.configure(msgspec.structs.replace(
        service.config, proxies=[ProxyServer(url=f"http://127.0.0.1:{port}", name="dead")],
    ))  # fmt: skip
    urls = [site.url(f"/pages/{i}") for i in range(3)]
    job = (await client.post("/v2/batch/scrape", json={"urls": urls})).json()["id"]
    assert await wait_finished(client, job, "batch") == "completed"
    errors = (await client.get(f"/v2/batch/scrape/{job}/errors")).json()["errors"]
    assert sorted(e["url"] for e in errors) == sorted(urls)
    assert all("cannot connect to proxy dead" in e["error"] for e in errors)
    assert sum(site.counts[f"/pages/{i}"] for i in range(3)) == 0
    status = (await client.get("/status")).json()["crawl"]["proxies"]
    assert status["basic"][0]["outcomes"] == {"SCRAPE_SITE_ERROR": 3}
