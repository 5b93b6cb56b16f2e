from __future__ import annotations

import functools

import trio
import trio.testing

from daemon.crawl.content.document import DocumentOptions, build_document, page_links
from daemon.crawl.discovery.robots import fetch_robots
from daemon.crawl.fetching.fetch import Fetcher, FetchError
from daemon.crawl.fetching.urls import CrawlScope
from daemon.fakes.site import SiteSim, serve_site


async def test_tree_reaches_every_page_from_home(site: SiteSim, fetcher: Fetcher) -> None:
    """Breadth-first over links of the tree: every generated page is reachable, depth log2."""
    scope = CrawlScope(start_url=site.url("/pages/"))
    seen = {site.url("/pages/0")}
    frontier = [site.url("/pages/0")]
    depth = 0
    while frontier:
        depth += 1
        nxt = []
        for url in frontier:
            for link in page_links(await fetcher.fetch(url)):
                if scope.refusal(link) is None and link not in seen:
                    seen.add(link)
                    nxt.append(link)
        frontier = nxt
    assert seen == set(site.tree_urls())
    assert depth == 8  # 150 pages: levels 0..7, then an empty frontier


async def test_home_links_every_special_case(site: SiteSim, fetcher: Fetcher) -> None:
    links = page_links(await fetcher.fetch(site.url("/")))
    for path in (
        "/pages/0",
        "/chain/0",
        "/slow",
        "/redirect/metadata",
        "/files/doc.pdf",
        "/pages/2/",
    ):
        assert site.url(path) in links
    assert site.url("/pages/1", host="www.site.test") in links
    assert site.url("/", host="blog.site.test") in links
    assert "http://other.test/page" in links


async def test_chain_depth(site: SiteSim, fetcher: Fetcher) -> None:
    last = await fetcher.fetch(site.url(f"/chain/{site.chain_depth - 1}"))
    assert page_links(last) == [site.url("/"), site.url("/about")]
    first = page_links(await fetcher.fetch(site.url("/chain/0")))
    assert site.url("/chain/1") in first


async def test_duplicates_serve_the_same_page(site: SiteSim, fetcher: Fetcher) -> None:
    a = await fetcher.fetch(site.url("/pages/2"))
    b = await fetcher.fetch(site.url("/pages/2/"))
    c = await fetcher.fetch(site.url("/pages/2", host="www.site.test"))
    assert a.body == b.body == c.body
    assert (await fetcher.fetch(site.url("/index.html"))).body == (
        await fetcher.fetch(site.url("/"))
    ).body


async def test_rich_page_document(site: SiteSim, fetcher: Fetcher) -> None:
    result = await fetcher.fetch(site.url("/rich"))
    options = DocumentOptions(formats=frozenset({"markdown", "links"}))
    doc = build_document(result, options, source_url=result.requested_url, scrape_id="x")
    md = doc["markdown"]
    assert md.startswith("# Rich content")
    assert '```python\ndef hello():\n    return "world"\n```' in md
    assert "| alpha | 1     |" in md
    assert "<Base64-Image-Removed>" in md
    assert site.url("/img/large.png") in md
    assert "Footer text" not in md and "Sidebar link" not in md
    assert doc["metadata"]["ogTitle"] == "Rich OG title"
    assert doc["links"] == [site.url("/pages/3")]


async def test_robots_blocks_as_documented(site: SiteSim, fetcher: Fetcher) -> None:
    robots = await fetch_robots(fetcher, site.url(""))
    assert not robots.allowed(site.url("/private/secret"))
    assert robots.allowed(site.url("/private/allowed"))
    assert not robots.allowed(site.url("/script.cgi"))
    assert robots.allowed(site.url("/script.cgi?x=1"))


async def test_blog_subdomain(site: SiteSim, fetcher: Fetcher) -> None:
    links = page_links(await fetcher.fetch(site.url("/", host="blog.site.test")))
    posts = [site.url(f"/posts/{k}", host="blog.site.test") for k in range(3)]
    assert links == [
        site.url("/", host="blog.site.test"),
        site.url("/about", host="blog.site.test"),
        *posts,
    ]
    assert site.hits[-1].host == "blog.site.test"


async def test_request_log(site: SiteSim, fetcher: Fetcher) -> None:
    await fetcher.fetch(site.url("/about?x=1"))
    await fetcher.fetch(site.url("/about?x=1"))
    assert site.counts["/about?x=1"] == 2
    assert [h.host for h in site.hits_for("/about?x=1")] == ["site.test", "site.test"]


async def test_unknown_paths_are_404(site: SiteSim, fetcher: Fetcher) -> None:
    for path in ("/pages/150", "/pages/x", "/chain/99", "/nope"):
        assert (await fetcher.fetch(site.url(path))).status_code == 404


async def test_slow_page_released_at_shutdown(fetcher: Fetcher) -> None:
    sim = SiteSim(slow_seconds=600)
    stop = trio.Event()
    statuses: list[int] = []

    async def fetch_slow() -> None:
        statuses.append((await fetcher.fetch(sim.url("/slow"))).status_code)

    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(serve_site, sim, shutdown=stop))
        nursery.start_soon(fetch_slow)
        while sim.counts["/slow"] == 0:
            await trio.testing.wait_all_tasks_blocked()
        stop.set()
    assert statuses == [200]


async def test_large_page_over_the_cap(site: SiteSim, fetcher: Fetcher) -> None:
    try:
        await fetcher.fetch(site.url("/large"))
    except FetchError as exc:
        assert "size cap" in exc.message
    else:
        raise AssertionError("the 64 KiB page passed a 32 KiB cap")
