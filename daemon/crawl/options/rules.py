# The crawl decisions that need no I/O, kept apart from the runner so they are tested as tables:
# which discovered links a page admits (scope, robots.txt, depth, dedupe key, in Firecrawl's
# order), how many fetches a job runs at once and how far apart, and which URLs /v2/map returns.
from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec

from daemon.crawl.fetching.urls import dedupe_key, parse_http_url, registrable_domain, strip_www

Candidate = tuple[str, str, int]
"""(dedupe key, URL, depth) of a URL a page offers to the frontier."""


class LinkPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """What a crawl follows from a fetched page."""

    follow_links: bool = True
    """False for sitemap:"only" crawls and batches."""
    max_depth: int | None = None
    """maxDiscoveryDepth: links of a page at this depth are not followed."""
    ignore_query: bool = False
    similar: bool = True


class Admission(msgspec.Struct, frozen=True):
    candidates: list[Candidate]
    robots_blocked: list[str]


def admit_links(
    links: Iterable[str],
    depth: int,
    policy: LinkPolicy,
    refusal: Callable[[str], str | None],
    robots_allowed: Callable[[str], bool],
) -> Admission:
    """The links of a page at `depth` the frontier should consider, deduplicated within the
    page and without fragments, and those robots.txt refused. Dedupe against the frontier and
    the `limit` are the store's part (they need the crawl's history)."""
    if not policy.follow_links or (policy.max_depth is not None and depth >= policy.max_depth):
        return Admission([], [])
    seen: set[str] = set()
    out: list[Candidate] = []
    blocked: list[str] = []
    for link in links:
        if refusal(link) is not None:
            continue
        url = link.split("#", 1)[0] if "#/" not in link else link
        key = dedupe_key(url, ignore_query=policy.ignore_query, similar=policy.similar)
        if key in seen:
            continue
        seen.add(key)
        if not robots_allowed(url):
            blocked.append(url)
            continue
        out.append((key, url, depth + 1))
    return Admission(out, blocked)


def fetch_pacing(
    *,
    max_concurrency: int | None,
    delay: float | None,
    robots_delay: float | None,
    ignore_robots: bool,
    global_concurrency: int,
) -> tuple[int, float | None]:
    """(fetches a job runs at once, seconds between starts per host). A `delay` (given, or
    robots.txt's Crawl-delay when none is given and robots are honoured) forces one at a time."""
    pause = delay if delay is not None else (None if ignore_robots else robots_delay)
    if pause:
        return 1, pause
    return max(1, min(max_concurrency or global_concurrency, global_concurrency)), None


def map_links(
    start_url: str,
    found: Iterable[str],
    *,
    include_subdomains: bool,
    ignore_query: bool,
    search: str | None,
    limit: int,
) -> list[str]:
    """/v2/map's answer: the start URL's site (host without `www.`, or its registrable domain
    with `include_subdomains`), one URL per dedupe key, fragments dropped, `search` (words,
    case-insensitive) ranking URLs containing more of its words first; at most `limit`."""
    start = parse_http_url(start_url)
    if start is None:
        return []
    start_host = strip_www(start.raw_host or "")
    start_domain = registrable_domain(start_host)
    seen: set[str] = set()
    urls: list[str] = []
    for raw in found:
        url = raw.split("#", 1)[0]
        parsed = parse_http_url(url)
        if parsed is None:
            continue
        host = strip_www(parsed.raw_host or "")
        if host != start_host and not (
            include_subdomains and registrable_domain(host) == start_domain
        ):
            continue
        if ignore_query:
            url = str(parsed.with_query(None).with_fragment(None))
        key = dedupe_key(url, ignore_query=ignore_query, similar=True)
        if key in seen:
            continue
        seen.add(key)
        urls.append(url)
    if search:
        words = [w for w in search.lower().split() if w]
        scored = [(-sum(w in u.lower() for w in words), i, u) for i, u in enumerate(urls)]
        urls = [u for score, _, u in sorted(scored) if score < 0]
    return urls[:limit]
