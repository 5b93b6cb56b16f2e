"""The document cache through a whole crawld: maxAge / minAge / lockdown / storeInCache /
zeroDataRetention against a site that counts its requests, what is never cached, crawls served
from the cache, the admin DELETE, /status, /metrics and /openapi.json. The store-level bounds on
both backends are in test_cache_store.py."""

from __future__ import annotations

from typing import Any

import httpx
from firecrawl import Firecrawl

from daemon.fakes.site import SiteSim
from tests.conftest import unlabelled
from tests.crawlapi.conftest import wait_finished


async def scrape(client: httpx.AsyncClient, url: str, **options: Any) -> httpx.Response:
    return await client.post("/v2/scrape", json={"url": url, **options})


def state(response: httpx.Response) -> tuple[str | None, str | None]:
    metadata = response.json()["data"]["metadata"]
    return metadata.get("cacheState"), metadata.get("cachedAt")


async def test_max_age_serves_a_copy_and_options_are_in_the_key(
    client: httpx.AsyncClient, site: SiteSim
) -> None:
    url = site.url("/pages/1")
    first = await scrape(client, url)
    assert first.status_code == 200 and state(first) == ("miss", None)
    again = await scrape(client, url)
    cache_state, cached_at = state(again)
    assert cache_state == "hit" and cached_at is not None and cached_at.endswith("Z")
    assert again.json()["data"]["markdown"] == first.json()["data"]["markdown"]
    assert (
        again.json()["data"]["metadata"]["scrapeId"] != first.json()["data"]["metadata"]["scrapeId"]
    )
    assert site.counts["/pages/1"] == 1
    assert state(await scrape(client, url + "#part"))[0] == "hit"  # the fragment is not a key
    assert state(await scrape(client, url, maxAge=0))[0] == "miss"  # 0: never read
    assert site.counts["/pages/1"] == 2
    changed = await scrape(client, url, onlyMainContent=False)
    assert state(changed)[0] == "miss" and site.counts["/pages/1"] == 3
    formats = await scrape(client, url, formats=["markdown", "links"])
    assert state(formats)[0] == "miss" and site.counts["/pages/1"] == 4
    assert state(await scrape(client, url, formats=["markdown", "links"], timeout=9000))[0] == (
        "hit"
    )  # timeout does not change the document
    assert site.counts["/pages/1"] == 4


async def test_min_age_and_lockdown_never_fetch(client: httpx.AsyncClient, site: SiteSim) -> None:
    url = site.url("/pages/2")
    miss = await scrape(client, url, minAge=1)
    assert miss.status_code == 404 and miss.json()["code"] == "SCRAPE_NO_CACHED_DATA"
    locked = await scrape(client, url, lockdown=True)
    assert locked.status_code == 404
    assert locked.json()["code"] == "SCRAPE_LOCKDOWN_CACHE_MISS"
    assert "lockdown mode" in locked.json()["error"]
    assert site.counts["/pages/2"] == 0
    await scrape(client, url)
    assert state(await scrape(client, url, minAge=1))[0] == "hit"
    assert state(await scrape(client, url, lockdown=True))[0] == "hit"
    too_young = await scrape(client, url, minAge=3_600_000)
    assert too_young.status_code == 404 and too_young.json()["code"] == "SCRAPE_NO_CACHED_DATA"
    assert site.counts["/pages/2"] == 1


async def test_what_is_never_written_or_read(client: httpx.AsyncClient, site: SiteSim) -> None:
    url = site.url("/pages/3")
    await scrape(client, url, storeInCache=False)
    await scrape(client, url, zeroDataRetention=True)
    assert site.counts["/pages/3"] == 2
    assert state(await scrape(client, url))[0] == "miss"  # neither of the two wrote
    assert site.counts["/pages/3"] == 3
    assert state(await scrape(client, url, zeroDataRetention=True))[0] == "hit"  # reads
    for _ in range(2):  # custom headers: neither read nor written
        assert state(await scrape(client, url, headers={"X-Test": "1"}))[0] == "miss"
    assert site.counts["/pages/3"] == 5
    missing = site.url("/no/such/page")
    for _ in range(2):  # only successful pages are kept
        assert (await scrape(client, missing)).json()["data"]["metadata"]["statusCode"] == 404
    assert site.counts["/no/such/page"] == 2


async def test_a_second_crawl_is_served_from_the_cache(
    client: httpx.AsyncClient, site: SiteSim
) -> None:
    body = {"url": site.url("/pages/0"), "limit": 4, "sitemap": "skip", "crawlEntireDomain": True}
    first = (await client.post("/v2/crawl", json=body)).json()["id"]
    assert await wait_finished(client, first) == "completed"
    fetched = sum(n for path, n in site.counts.items() if path != "/robots.txt")
    assert fetched == 4
    second = (await client.post("/v2/crawl", json=body)).json()["id"]
    assert await wait_finished(client, second) == "completed"
    pages = (await client.get(f"/v2/crawl/{second}")).json()["data"]
    assert len(pages) == 4 and {p["metadata"]["cacheState"] for p in pages} == {"hit"}
    assert sum(n for path, n in site.counts.items() if path != "/robots.txt") == fetched


async def test_admin_delete_by_prefix_status_and_metrics(
    client: httpx.AsyncClient, site: SiteSim
) -> None:
    for path in ("/pages/4", "/pages/5", "/about"):
        await scrape(client, site.url(path))
    deleted = await client.request("DELETE", "/v2/cache", json={"urlPrefix": site.url("/pages/")})
    assert deleted.status_code == 200 and deleted.json() == {"success": True, "deleted": 2}
    assert state(await scrape(client, site.url("/pages/4")))[0] == "miss"
    assert state(await scrape(client, site.url("/about")))[0] == "hit"
    for bad in ({}, {"urlPrefix": ""}, {"urlPrefix": "/pages"}, {"urlPrefix": "http", "x": 1}):
        answer = await client.request("DELETE", "/v2/cache", json=bad)
        assert answer.status_code == 400 and answer.json()["details"], bad
    cache = (await client.get("/status")).json()["crawl"]["cache"]
    assert cache["entries"] == 2 and cache["bytes"] > 0
    assert cache["hits"] == 1 and cache["misses"] == 4 and cache["evicted"] == 2
    metrics = unlabelled((await client.get("/metrics")).text)
    assert 'crawld_crawl_cache_lookups_total{result="hit"}' in metrics
    spec = (await client.get("/openapi.json")).json()
    operation = spec["paths"]["/v2/cache"]["delete"]
    assert operation["requestBody"]["required"] is True
    assert "404" in spec["paths"]["/v2/scrape"]["post"]["responses"]


async def test_v1_reads_no_copy_unless_asked(client: httpx.AsyncClient, site: SiteSim) -> None:
    url = site.url("/pages/6")
    await scrape(client, url)
    v1 = await client.post("/v1/scrape", json={"url": url})
    assert v1.status_code == 200 and v1.json()["data"]["metadata"]["cacheState"] == "miss"
    asked = await client.post("/v1/scrape", json={"url": url, "maxAge": 3_600_000})
    assert asked.json()["data"]["metadata"]["cacheState"] == "hit"
    assert site.counts["/pages/6"] == 2


async def test_sdk_max_age_store_in_cache_and_lockdown(
    fc: Firecrawl, sdk: Any, site: SiteSim
) -> None:
    from firecrawl.v2.utils.error_handler import FirecrawlError

    url = site.url("/pages/7")
    first = await sdk(fc.scrape, url, formats=["markdown"], store_in_cache=False)
    assert first.metadata.cache_state == "miss"
    try:
        await sdk(fc.scrape, url, lockdown=True)
    except FirecrawlError as exc:
        assert getattr(exc, "status_code", 404) == 404
    else:
        raise AssertionError("a lockdown miss is an error")
    await sdk(fc.scrape, url, formats=["markdown"])
    hit = await sdk(fc.scrape, url, formats=["markdown"], max_age=60_000)
    assert hit.metadata.cache_state == "hit" and hit.metadata.cached_at
    assert site.counts["/pages/7"] == 2


async def test_sdk_defaults_and_a_bare_request_share_their_copies(
    client: httpx.AsyncClient, fc: Firecrawl, sdk: Any, site: SiteSim
) -> None:
    """firecrawl-py sends Firecrawl's defaults (mobile: false, blockAds: true, ...) with every
    scrape that sets an option; a bare `{url}` sends none: both are the same request."""
    bare = site.url("/pages/8")
    assert state(await scrape(client, bare))[0] == "miss"
    locked = await sdk(fc.scrape, bare, formats=["markdown"], max_age=3_600_000, lockdown=True)
    assert locked.metadata.cache_state == "hit"
    assert site.counts["/pages/8"] == 1
    by_sdk = site.url("/pages/9")
    first = await sdk(fc.scrape, by_sdk, formats=["markdown"], max_age=3_600_000)
    assert first.metadata.cache_state == "miss"
    assert state(await scrape(client, by_sdk, lockdown=True))[0] == "hit"
    assert state(await scrape(client, by_sdk))[0] == "hit"
    assert site.counts["/pages/9"] == 1
