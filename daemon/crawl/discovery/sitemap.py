# Sitemaps seed a crawl (and answer /v2/map) with URLs that links may never reach. Parsing is a
# pure function over bytes, fetching a thin loop around it.
#
# Sitemaps come from strangers, so the parser is defensive: lxml with entity resolution, network
# access, DTD loading and huge-tree mode off (no XXE, no billion laughs), gzip decompressed with a
# cap on the decompressed size (no gzip bomb), index recursion bounded in depth and in the number
# of sitemap files, every fetch through the SSRF-guarded Fetcher. A sitemap that fails to fetch
# or parse is skipped: sitemaps only add URLs, the crawl goes on without them.
#
# Discovery follows Firecrawl: the robots.txt `Sitemap:` lines, then `<start URL>/sitemap.xml`,
# `<origin>/sitemap.xml` and `<registrable domain>/sitemap.xml`. In a urlset, a `<loc>` ending in
# `.xml` or `.xml.gz` is a sub-sitemap (Firecrawl's rule); plain-text sitemaps (one URL a line)
# are read too.
from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable

from lxml import etree
from yarl import URL

from daemon.crawl.discovery.robots import Robots
from daemon.crawl.fetching.fetch import Fetcher, FetchError
from daemon.crawl.fetching.urls import parse_http_url, registrable_domain
from daemon.logs import get_logger
from daemon.redact import cap, redact_url

log = get_logger("crawl.sitemap")

MAX_SITEMAP_BYTES = 50 * 1024 * 1024
"""Largest decompressed sitemap read (the sitemap protocol's own limit)."""
MAX_DEPTH = 3
"""Sitemap index nesting followed (an index of indexes of sitemaps)."""
MAX_SITEMAPS = 100
"""Sitemap files fetched for one crawl or map."""

_GZIP_MAGIC = b"\x1f\x8b"


class SitemapError(ValueError):
    """The bytes are not a sitemap this parser reads."""


def _parser() -> etree.XMLParser:
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        huge_tree=False,
        recover=True,
        remove_comments=True,
        remove_pis=True,
    )


def gunzip_capped(data: bytes, cap: int = MAX_SITEMAP_BYTES) -> bytes:
    """Decompress gzip `data`, refusing output over `cap` bytes."""
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(data, cap + 1)
    except zlib.error as exc:
        raise SitemapError(f"bad gzip data: {exc}") from None
    if len(out) > cap or inflater.unconsumed_tail:
        raise SitemapError(f"sitemap larger than {cap} bytes once decompressed")
    return out


def _local(tag: object) -> str:
    return tag.rsplit("}", 1)[-1].lower() if isinstance(tag, str) else ""


def _is_sitemap_loc(loc: str) -> bool:
    path = loc.split("?", 1)[0].lower()
    return path.endswith((".xml", ".xml.gz"))


def parse_sitemap(data: bytes) -> tuple[list[str], list[str]]:
    """(page URLs, sub-sitemap URLs) of a urlset, a sitemap index or a plain-text sitemap,
    gzipped or not, each list deduplicated in document order. Raises SitemapError when the
    bytes are none of these."""
    if data[:2] == _GZIP_MAGIC:
        data = gunzip_capped(data)
    elif len(data) > MAX_SITEMAP_BYTES:
        raise SitemapError(f"sitemap larger than {MAX_SITEMAP_BYTES} bytes")
    stripped = data.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not stripped.startswith(b"<"):
        lines = stripped.decode("utf-8", "replace").splitlines()
        urls = [u for u in (line.strip() for line in lines) if parse_http_url(u) is not None]
        if not urls:
            raise SitemapError("neither XML nor a list of URLs")
        return list(dict.fromkeys(urls)), []
    try:
        root = etree.fromstring(stripped, _parser())
    except etree.XMLSyntaxError as exc:
        raise SitemapError(f"not XML: {exc}") from None
    if root is None:
        raise SitemapError("not XML")
    kind = _local(root.tag)
    if kind not in ("urlset", "sitemapindex"):
        raise SitemapError(f"root element <{kind}> is neither <urlset> nor <sitemapindex>")
    pages: dict[str, None] = {}
    subs: dict[str, None] = {}
    for entry in root:
        if _local(entry.tag) not in ("url", "sitemap"):
            continue
        for child in entry:
            if _local(child.tag) != "loc" or not child.text:
                continue
            loc = child.text.strip()
            if parse_http_url(loc) is None:
                continue
            if kind == "sitemapindex" or _is_sitemap_loc(loc):
                subs.setdefault(loc, None)
            else:
                pages.setdefault(loc, None)
    return list(pages), list(subs)


def sitemap_candidates(start_url: str, robots: Robots) -> list[str]:
    """Where to look for sitemaps, in Firecrawl's order, deduplicated."""
    found = list(robots.sitemaps)
    start = parse_http_url(start_url)
    if start is not None:
        origin = start.origin()
        found.append(str(start.with_query(None).with_fragment(None)).rstrip("/") + "/sitemap.xml")
        found.append(f"{origin}/sitemap.xml")
        domain = registrable_domain(start.raw_host or "")
        if domain != start.raw_host:
            found.append(
                str(
                    URL.build(
                        scheme=start.scheme,
                        host=domain,
                        port=start.explicit_port,
                        path="/sitemap.xml",
                    )
                )
            )
    return list(dict.fromkeys(found))


async def sitemap_urls(
    fetcher: Fetcher,
    start_url: str,
    robots: Robots,
    *,
    limit: int,
    accept: Callable[[str], bool] | None = None,
    timeout: float | None = None,
) -> list[str]:
    """Page URLs from the site's sitemaps (see `sitemap_candidates`), index files followed
    breadth-first up to MAX_DEPTH and MAX_SITEMAPS files, deduplicated, at most `limit` of
    them. `accept(url)` filters page URLs before they count against the limit."""
    queue = deque((url, 0) for url in sitemap_candidates(start_url, robots))
    visited: set[str] = set()
    pages: dict[str, None] = {}
    while queue and len(pages) < limit and len(visited) < MAX_SITEMAPS:
        url, depth = queue.popleft()
        if url in visited:
            continue
        visited.add(url)
        try:
            result = await fetcher.fetch(url, timeout=timeout, any_content_type=True)
        except FetchError as exc:
            log.debug("sitemap not fetched", url=cap(redact_url(url)), code=exc.code)
            continue
        if result.status_code >= 400:
            continue
        try:
            found, subs = parse_sitemap(result.body)
        except SitemapError as exc:
            log.debug("sitemap not parsed", url=cap(redact_url(url)), error=str(exc))
            continue
        for page in found:
            if accept is None or accept(page):
                pages.setdefault(page, None)
                if len(pages) >= limit:
                    break
        if depth < MAX_DEPTH:
            queue.extend((sub, depth + 1) for sub in subs if sub not in visited)
    return list(pages)
