"""Crawls through firecrawl-py against the generated site: what is fetched, what is refused,
counters, pagination with `next`, errors and robotsBlocked, every crawl option."""

from __future__ import annotations

from collections import Counter
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from firecrawl import Firecrawl
from firecrawl.v2.types import ScrapeOptions, WebhookConfig

from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.site import SiteSim

from .conftest import CONFIG, wait_finished


def source_urls(job: Any) -> list[str]:
    return [d.metadata_dict["source_url"] for d in job.data]


def paths(urls: list[str], site: SiteSim) -> set[str]:
    """Paths of site.test URLs (www.site.test counts as site.test: one site)."""
    out = set()
    for url in urls:
        for host in ("site.test", "www.site.test"):
            url = url.removeprefix(f"http://{host}:{site.port}")
        out.add(url)
    return out


WHOLE_PAGES = CONFIG.replace('page_timeout = "5s"', 'page_timeout = "30s"')
"""These crawls check that every page arrived: on a loaded machine a page (the site runs in the
test's own process) can take more than the 5 s of CONFIG, and would end as a failed page."""


@pytest.fixture
def crawl_config() -> str:
    return WHOLE_PAGES


async def crawl(fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, url: str, **kw: Any) -> Any:
    started = await sdk(fc.start_crawl, url, **kw)
    await wait_finished(client, started.id)
    return started.id, await sdk(fc.get_crawl_status, started.id)


async def test_whole_site_crawl(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim
) -> None:
    job_id, job = await crawl(fc, sdk, client, site.url("/"))
    assert job.status == "completed"
    urls = [d.metadata_dict["source_url"] for d in job.data]
    assert len(urls) == len(set(urls)) == job.completed == job.total == job.credits_used
    assert len(urls) > 100  # more than one status page: the SDK followed `next`
    got = paths(urls, site)
    finals = [d.metadata.url for d in job.data]
    assert len(paths(finals, site)) == len(finals)  # one document per page
    # /pages/1 is linked as www.site.test/pages/1 too (and /redirect/www), /pages/2 as /pages/2/
    # (from the home page; /pages/2 from /pages/0, which the sitemap admits beside the home
    # page): whichever form the crawl reached first is the document, the other a duplicate
    # never fetched (which is first depends on the order fetches end in)
    final_paths = paths(finals, site)
    assert {f"/pages/{i}" for i in range(150) if i != 2} <= final_paths
    (pages_2,) = {"/pages/2", "/pages/2/"} & final_paths
    assert {"/pages/2", "/pages/2/"} & got == {pages_2}
    assert site.counts["/pages/2"] + site.counts["/pages/2/"] == site.counts[pages_2] == 1
    pages_1 = {site.url("/pages/1", host=h) for h in ("site.test", "www.site.test")}
    assert len(pages_1 & set(finals)) == 1
    assert len({"/redirect/www", "/pages/1"} & got) == 1  # whichever was fetched first
    assert {f"/chain/{d}" for d in range(6)} <= got
    assert {f"/orphans/{k}" for k in range(5)} <= got  # from the gzipped sitemap of the index
    assert {"/", "/about", "/rich", "/private/allowed", "/agent-test/page"} <= got
    assert {"/status/404", "/status/500", "/files/data.json", "/files/notes.txt"} <= got
    refused = {"/private/secret", "/script.cgi", "/files/image.png"} & got
    assert not refused, (refused, sorted(got))
    duplicates = {"/index.html", "/redirect/out"} & got
    assert not duplicates, (duplicates, sorted(got))
    by_path = {paths([u], site).pop(): d for u, d in zip(urls, job.data, strict=True)}
    assert by_path["/status/404"].metadata.status_code == 404
    assert by_path["/status/500"].metadata.status_code == 500
    assert by_path["/files/data.json"].markdown.startswith("```json")
    # each page fetched once; www/trailing-slash/index duplicates and refused links never
    # redirects (/redirect/chain/3 -> /pages/0, /redirect/www -> /pages/1) may race their target
    redirect_targets = {"/pages/0", "/pages/1"}
    assert {n for p, n in site.counts.items() if p.startswith("/pages/")
            and p not in redirect_targets} == {1}  # fmt: skip
    assert site.counts["/private/secret"] == 0 and site.counts["/files/image.png"] == 0
    assert not [h for h in site.hits if h.host == "blog.site.test"]

    errors = await sdk(fc.get_crawl_errors, job_id)
    assert {paths([u], site).pop() for u in errors.robots_blocked} >= {"/private/secret"}
    by_url = {paths([e.url], site).pop(): e for e in errors.errors}
    assert by_url["/redirect/metadata"].code == "CRAWL_DENIAL"
    assert by_url["/redirect/out"].code == "CRAWL_DENIAL"
    assert by_url["/redirect/loop/a"].code == "SCRAPE_SITE_ERROR"
    assert by_url["/files/doc.pdf"].code == "SCRAPE_UNSUPPORTED_FILE_ERROR"
    assert all(e.timestamp is not None for e in errors.errors)


async def test_status_pages_and_next(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim
) -> None:
    job_id, job = await crawl(fc, sdk, client, site.url("/pages/0"), limit=120, sitemap="skip",
                              crawl_entire_domain=True, include_paths=["^/pages/"])  # fmt: skip
    assert job.completed == 120
    first = (await client.get(f"/v2/crawl/{job_id}")).json()
    assert len(first["data"]) == 100
    assert first["next"].endswith(f"/v2/crawl/{job_id}?skip=100")
    rest = (await client.get(first["next"])).json()
    assert len(rest["data"]) == 20 and "next" not in rest
    everything = first["data"] + rest["data"]
    assert [d["metadata"]["sourceURL"] for d in everything] == source_urls(job)
    again = (await client.get(f"/v2/crawl/{job_id}", params={"skip": 50, "limit": 10})).json()
    assert again["data"] == everything[50:60]
    assert parse_qs(urlsplit(again["next"]).query) == {"skip": ["60"], "limit": ["10"]}


async def test_crawl_waits_with_the_sdk(fc: Firecrawl, sdk: Any, site: SiteSim) -> None:
    job = await sdk(fc.crawl, site.url("/chain/0"), poll_interval=1, sitemap="skip",
                    crawl_entire_domain=True, include_paths=["^/chain/"])  # fmt: skip
    assert job.status == "completed"
    assert sorted(paths(source_urls(job), site)) == [f"/chain/{d}" for d in range(6)]


@pytest.mark.parametrize(
    ("options", "expected", "absent"),
    [
        (
            {"max_discovery_depth": 2},
            {"/pages/0", "/chain/0", "/chain/1"},
            {"/pages/7", "/chain/2"},
        ),
        (
            {"include_paths": ["^/chain/[0-2]$"], "crawl_entire_domain": True},
            {"/chain/0", "/chain/1", "/chain/2"},
            {"/about", "/chain/3"},
        ),
        (
            {"exclude_paths": ["^/pages/", "files"]},
            {"/about", "/chain/5"},
            {"/pages/0", "/files/data.json"},
        ),
        (
            {
                "regex_on_full_url": True,
                "include_paths": [r"site\.test:\d+/(chain|$)"],
                "crawl_entire_domain": True,
            },
            {"/chain/3"},
            {"/about"},
        ),
        ({"allow_subdomains": True}, set(), set()),
        ({"ignore_robots_txt": True}, {"/private/secret", "/script.cgi"}, set()),
        ({"sitemap": "only"}, {"/orphans/0", "/pages/10", "/about"}, {"/pages/1", "/chain/0"}),
    ],
)
async def test_crawl_options(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim,
    options: dict[str, Any], expected: set[str], absent: set[str],
) -> None:  # fmt: skip
    options.setdefault("sitemap", "skip")
    _, job = await crawl(fc, sdk, client, site.url("/"), **options)
    got = paths(source_urls(job), site)
    # A page reached both by a link and at the end of a redirect (the home page's
    # /redirect/chain/3 ends at /pages/0) is fetched once, under whichever answered first.
    reached = got | paths([d.metadata_dict.get("url", "") for d in job.data], site)
    assert expected <= reached
    assert not absent & got
    if options.get("allow_subdomains"):
        blog = [u for u in source_urls(job) if "blog.site.test" in u]
        assert {f"http://blog.site.test:{site.port}/posts/{k}" for k in range(3)} <= set(blog)


async def test_start_path_prefix_unless_crawl_entire_domain(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim
) -> None:
    _, narrow = await crawl(fc, sdk, client, site.url("/chain/2"), sitemap="skip")
    assert paths(source_urls(narrow), site) == {"/chain/2"}  # /chain/3 is not under /chain/2
    _, wide = await crawl(fc, sdk, client, site.url("/chain/2"), sitemap="skip",
                          crawl_entire_domain=True)  # fmt: skip
    assert {"/chain/2", "/chain/3", "/chain/4", "/chain/5", "/"} <= paths(source_urls(wide), site)


async def test_limit_counts_successful_pages(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim
) -> None:
    job_id, job = await crawl(fc, sdk, client, site.url("/"), limit=25, sitemap="skip")
    assert job.completed == job.total == len(job.data) == 25
    errors = await sdk(fc.get_crawl_errors, job_id)
    # failed pages gave their slot back: 25 documents although some pages failed
    assert len(job.data) + len(errors.errors) >= 25


async def test_query_parameters_and_similar_urls(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim
) -> None:
    _, job = await crawl(fc, sdk, client, site.url("/"), sitemap="skip",
                         deduplicate_similar_urls=False, limit=400)  # fmt: skip
    got = set(source_urls(job))
    assert site.url("/pages/2/") in got and site.url("/pages/2") in got
    assert site.url("/index.html") in got and site.url("/") in got
    _, job = await crawl(fc, sdk, client, site.url("/script.cgi?x=1"), ignore_query_parameters=True,
                         sitemap="skip")  # fmt: skip
    assert source_urls(job) == [site.url("/script.cgi?x=1")]


async def test_delay_and_concurrency_are_honoured_at_the_site(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim
) -> None:
    # the SDK types `delay` as whole seconds; the API takes fractions
    body = {"url": site.url("/chain/0"), "sitemap": "skip", "delay": 0.2,
            "includePaths": ["^/chain/"], "crawlEntireDomain": True}  # fmt: skip
    job_id = (await client.post("/v2/crawl", json=body)).json()["id"]
    assert await wait_finished(client, job_id) == "completed"
    times = [h.at for h in site.hits if h.path.startswith("/chain/")]
    assert len(times) == 6
    # The gate spaces request starts; the site sees arrivals, each at or after its start, so
    # only the first arrival's lateness can shorten the span (one gap alone may look short when
    # the request before it arrived late).
    assert times[-1] - times[0] >= 5 * 0.2 - 0.1
    _, job = await crawl(fc, sdk, client, site.url("/pages/0"), sitemap="skip", limit=30,
                         max_concurrency=2, include_paths=["^/pages/"],
                         crawl_entire_domain=True)  # fmt: skip
    assert job.completed == 30


async def test_robots_crawl_delay_applies_unless_ignored(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim
) -> None:
    site.crawl_delay = 0.1
    await crawl(fc, sdk, client, site.url("/chain/0"), sitemap="skip",
                include_paths=["^/chain/"], crawl_entire_domain=True)  # fmt: skip
    times = [h.at for h in site.hits if h.path.startswith("/chain/")]
    assert len(times) == 6 and times[-1] - times[0] >= 5 * 0.1 - 0.05


async def test_webhook_events_in_order_with_documents(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim, rx: WebhookReceiver
) -> None:
    hook = WebhookConfig(url=rx.url(), metadata={"who": "test"})
    job_id, job = await crawl(fc, sdk, client, site.url("/chain/0"), sitemap="skip",
                              webhook=hook, crawl_entire_domain=True)  # fmt: skip
    events = await rx.wait_delivered(len(job.data) + 2, job_id)
    rx.check()
    types = [e.type for e in events]
    assert types[0] == "crawl.started" and types[-1] == "crawl.completed"
    assert Counter(types)["crawl.page"] == len(job.data)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    pages = [e.event["data"][0]["metadata"]["sourceURL"] for e in events[1:-1]]
    assert pages == source_urls(job)  # webhook order = status order
    assert events[1].event["metadata"] == {"who": "test"}


async def test_zero_data_retention_sends_documents_only_to_the_webhook(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim, rx: WebhookReceiver
) -> None:
    job_id, job = await crawl(fc, sdk, client, site.url("/chain/3"), sitemap="skip",
                              webhook=rx.url(), zero_data_retention=True)  # fmt: skip
    assert job.status == "completed" and job.completed == 1 and job.data == []
    events = await rx.wait_delivered(3, job_id)
    assert events[1].event["data"][0]["markdown"].startswith("# Chain 3")


async def test_scrape_options_reach_the_documents(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim
) -> None:
    options = ScrapeOptions(formats=["html", "links"], only_main_content=False)
    _, job = await crawl(fc, sdk, client, site.url("/rich"), sitemap="skip",
                         scrape_options=options)  # fmt: skip
    rich = job.data[0]
    assert rich.markdown is None and "Footer text" in rich.html
    assert site.url("/pages/3") in rich.links


async def test_cancel_then_conflict(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim
) -> None:
    site.slow_seconds = 30
    started = await sdk(fc.start_crawl, site.url("/slow"), sitemap="skip")
    active = await sdk(fc.get_active_crawls)
    assert [(c.id, c.team_id, c.url) for c in active.crawls] == [
        (started.id, "crawld", site.url("/slow"))
    ]
    assert (await client.get("/v2/crawl/ongoing")).json()["crawls"][0]["id"] == started.id
    assert await sdk(fc.cancel_crawl, started.id) is True
    assert await wait_finished(client, started.id) == "cancelled"
    assert await sdk(fc.cancel_crawl, started.id) is False  # 409
    assert (await sdk(fc.get_active_crawls)).crawls == []
    status = await sdk(fc.get_crawl_status, started.id)
    assert status.status == "cancelled"


async def test_unknown_job_and_bad_requests(client: httpx.AsyncClient, site: SiteSim) -> None:
    unknown = "00000000-0000-4000-8000-000000000000"
    answer = await client.get(f"/v2/crawl/{unknown}")
    assert (answer.status_code, answer.json()) == (
        404,
        {"success": False, "error": "Job not found"},
    )
    assert (await client.delete(f"/v2/crawl/{unknown}")).status_code == 404
    answer = await client.post("/v2/crawl", json={"url": site.url("/"), "bogus": 1,
                                                  "scrapeOptions": {"nope": True}})  # fmt: skip
    body = answer.json()
    assert answer.status_code == 400
    assert (body["success"], body["code"], body["error"]) == (False, "BAD_REQUEST", "Bad Request")
    assert [d["path"] for d in body["details"]] == ["$.bogus", "$.scrapeOptions.nope"]
    answer = await client.post("/v2/crawl", json={"url": site.url("/"), "prompt": "find docs"})
    assert answer.status_code == 501 and "[llm] is not configured" in answer.text  # no [llm] here
    answer = await client.post("/v2/crawl", json={"url": site.url("/"), "includePaths": ["(?=x)"]})
    assert answer.status_code == 400 and "includePaths[0]" in answer.text
    answer = await client.post("/v2/crawl", json={"url": "ftp://x"})
    assert answer.status_code == 400


async def test_allow_external_links_follows_one_hop_out(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim
) -> None:
    job_id, _ = await crawl(fc, sdk, client, site.url("/"), sitemap="skip",
                              allow_external_links=True, max_discovery_depth=1)  # fmt: skip
    errors = await sdk(fc.get_crawl_errors, job_id)
    external = [e for e in errors.errors if e.url == "http://other.test/page"]
    # followed (other.test does not resolve here), social links and mail never
    assert [e.code for e in external] == ["SCRAPE_DNS_RESOLUTION_ERROR"]
    assert not [e for e in errors.errors if "twitter.com" in e.url or "mailto" in e.url]


@pytest.mark.parametrize(
    ("crawl_config", "workers"),
    [(WHOLE_PAGES + "content_workers = 2\n", 2), (WHOLE_PAGES + "content_workers = 0\n", 0)],
)
async def test_documents_come_from_the_content_workers(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim, workers: int
) -> None:
    _, job = await crawl(
        fc, sdk, client, site.url("/pages/0"), limit=20, sitemap="skip",
        crawl_entire_domain=True, include_paths=["^/pages/"],
    )  # fmt: skip
    assert job.status == "completed" and job.completed == 20
    assert all(d.markdown and d.markdown.startswith("# Page") for d in job.data)
    status = (await client.get("/status")).json()["crawl"]["content_workers"]
    if not workers:
        assert status is None  # made in the daemon, as before
        return
    assert status["size"] == 2 and 1 <= status["processes"] <= 2
    assert status["calls"] >= 20 and status["lost"] == status["busy"] == 0
