"""Batch scrape and map through firecrawl-py, and the async client's requests."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from firecrawl import AsyncFirecrawl, Firecrawl
from firecrawl.v2.utils.error_handler import FirecrawlError, RequestTimeoutError

from daemon.fakes.site import SiteSim

from .conftest import wait_finished


async def test_batch_scrape_keeps_duplicates_and_lists_invalid_urls(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim
) -> None:
    urls = [site.url("/about"), site.url("/about"), site.url("/files/doc.pdf"),
            site.url("/private/secret"), "http:///no-host"]  # fmt: skip
    started = await sdk(fc.start_batch_scrape, urls, ignore_invalid_urls=True,
                        formats=["markdown", "links"])  # fmt: skip
    assert started.invalid_urls == ["http:///no-host"]
    assert await wait_finished(client, started.id, "batch") == "completed"
    job = await sdk(fc.get_batch_scrape_status, started.id)
    sources = sorted(d.metadata_dict["source_url"] for d in job.data)
    # no dedupe, no robots.txt for batches; the pdf is an error
    assert sources == sorted([site.url("/about")] * 2 + [site.url("/private/secret")])
    assert (job.completed, job.total, job.credits_used) == (3, 3, 3)
    assert all(d.links is not None for d in job.data)
    errors = await sdk(fc.get_batch_scrape_errors, started.id)
    assert [(e.url, e.code) for e in errors.errors] == [
        (site.url("/files/doc.pdf"), "SCRAPE_UNSUPPORTED_FILE_ERROR")
    ]
    with pytest.raises(FirecrawlError):  # 409: the SDK raises for batches
        await sdk(fc.cancel_batch_scrape, started.id)


async def test_batch_scrape_waits_and_honours_idempotency_keys(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim
) -> None:
    urls = [site.url(f"/pages/{i}") for i in range(5)]
    job = await sdk(fc.batch_scrape, urls, poll_interval=1, idempotency_key="key-1", max_age=0)
    assert job.status == "completed" and len(job.data) == 5
    body = {"urls": urls, "maxAge": 0}  # each batch fetches (no copy from the cache)
    first = (await client.post("/v2/batch/scrape", json=body,
                               headers={"x-idempotency-key": "key-2"})).json()  # fmt: skip
    again = (await client.post("/v2/batch/scrape", json=body,
                               headers={"x-idempotency-key": "key-2"})).json()  # fmt: skip
    assert first["id"] == again["id"]
    other = (await client.post("/v2/batch/scrape", json=body)).json()
    assert other["id"] != first["id"]
    crawl = (await client.post("/v2/crawl", json={"url": site.url("/chain/5")},
                               headers={"x-idempotency-key": "key-2"})).json()  # fmt: skip
    assert crawl["id"] != first["id"]  # keys are per endpoint
    assert await wait_finished(client, first["id"], "batch") == "completed"
    assert sum(site.counts[f"/pages/{i}"] for i in range(5)) == 15  # 3 batches, not 4


async def test_batch_append_and_errors(client: httpx.AsyncClient, site: SiteSim) -> None:
    site.slow_seconds = 0.5
    first = (await client.post("/v2/batch/scrape", json={"urls": [site.url("/slow")]})).json()
    appended = await client.post(
        "/v2/batch/scrape", json={"urls": [site.url("/about")], "appendToId": first["id"]}
    )
    assert appended.json()["id"] == first["id"]
    assert await wait_finished(client, first["id"], "batch") == "completed"
    status = (await client.get(f"/v2/batch/scrape/{first['id']}")).json()
    assert sorted(d["metadata"]["sourceURL"] for d in status["data"]) == [
        site.url("/about"),
        site.url("/slow"),
    ]
    late = await client.post(
        "/v2/batch/scrape", json={"urls": [site.url("/")], "appendToId": first["id"]}
    )
    assert late.status_code == 409
    none_valid = await client.post("/v2/batch/scrape", json={"urls": ["nope"]})
    assert none_valid.status_code == 400 and "No valid URLs provided" in none_valid.text
    strict = await client.post(
        "/v2/batch/scrape", json={"urls": ["nope", site.url("/")], "ignoreInvalidURLs": False}
    )
    assert strict.status_code == 400 and "$.urls[0]" in strict.text


async def test_map(fc: Firecrawl, sdk: Any, site: SiteSim) -> None:
    links = [link.url for link in (await sdk(fc.map, site.url("/"))).links]
    assert links[0] == site.url("/")
    assert set(site.orphan_urls()) <= set(links)  # from the gzipped sitemap of the index
    assert site.url("/pages/0") in links and len(links) == len(set(links))
    assert f"http://blog.site.test:{site.port}/" in links  # includeSubdomains defaults to true
    narrow = await sdk(fc.map, site.url("/"), include_subdomains=False, sitemap="skip")
    assert not [link for link in narrow.links if "blog." in link.url]
    assert site.url("/orphans/0") not in [link.url for link in narrow.links]
    only = await sdk(fc.map, site.url("/"), sitemap="only", limit=3)
    assert len(only.links) == 3
    found = await sdk(fc.map, site.url("/"), search="orphans")
    assert {link.url for link in found.links} == set(site.orphan_urls())


async def test_map_links_carry_the_titles_of_the_pages_read(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim
) -> None:
    links = {link.url: link for link in (await sdk(fc.map, site.url("/"), sitemap="skip")).links}
    assert links[site.url("/")].title == "Home"  # the start page is always read
    page = links[site.url("/pages/0")]  # read for its links (sitemap skipped)
    assert (page.title, page.description) == ("Page 0", "Generated page 0")
    deeper = links[site.url("/pages/3")]  # only linked from a page read: never read itself
    assert deeper.title is None and deeper.description is None
    raw = (await client.post("/v2/map", json={"url": site.url("/"), "sitemap": "only"})).json()
    assert all(set(link) == {"url"} for link in raw["links"])  # sitemaps name no titles
    v1 = (await client.post("/v1/map", json={"url": site.url("/"), "limit": 3})).json()
    assert all(isinstance(link, str) for link in v1["links"])  # v1: URLs only, as before


async def test_map_timeout(fc: Firecrawl, sdk: Any, site: SiteSim) -> None:
    site.slow_seconds = 30
    with pytest.raises(RequestTimeoutError):
        await sdk(fc.map, site.url("/slow"), sitemap="skip", timeout=300)


async def test_async_client_gets_server_defaults(base_url: str, sdk: Any, site: SiteSim) -> None:
    async def use_async_client() -> tuple[Any, Any, Any]:
        client = AsyncFirecrawl(api_url=base_url)
        job = await client.crawl(url=site.url("/chain/4"), limit=5, poll_interval=1)
        doc = await client.scrape(site.url("/about"))
        mapped = await client.map(site.url("/"), limit=5)
        return job, doc, mapped

    job, doc, mapped = await sdk(asyncio.run, use_async_client())
    assert job.status == "completed"
    # only `url`, `limit` and `origin` were sent: the path-prefix scope (crawlEntireDomain
    # false) and the other defaults are the server's
    assert [d.metadata_dict["source_url"] for d in job.data] == [site.url("/chain/4")]
    assert "About" in doc.markdown
    assert len(mapped.links) == 5


async def test_batch_webhook_events(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim, rx: Any
) -> None:
    started = await sdk(fc.start_batch_scrape, [site.url("/about"), site.url("/rich")],
                        webhook=rx.url())  # fmt: skip
    events = await rx.wait_delivered(4, started.id)
    rx.check()
    assert [e.type for e in events] == [
        "batch_scrape.started",
        "batch_scrape.page",
        "batch_scrape.page",
        "batch_scrape.completed",
    ]


async def test_max_concurrency_is_honoured_at_the_site(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim
) -> None:
    site.slow_seconds = 0.1
    urls = [site.url(f"/slow?n={n}") for n in range(6)]
    started = await sdk(fc.start_batch_scrape, urls, max_concurrency=2)
    assert await wait_finished(client, started.id, "batch") == "completed"
    arrivals = sorted(h.at for h in site.hits if h.path.startswith("/slow"))
    assert len(arrivals) == 6
    # with two at a time, a third request is only sent once one of the two before it finished,
    # which the site answers 0.1 s after it arrived
    assert all(arrivals[k + 2] - arrivals[k] >= 0.1 for k in range(4))
