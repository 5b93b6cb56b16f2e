# robots.txt as Firecrawl reads it, so a site owner's rules for Firecrawl apply to crawld too.
# The rules are matched for the agent names FirecrawlAgent and FireCrawlAgent (both spellings
# exist in Firecrawl's code; a URL is allowed if either is allowed), never for the User-Agent
# header crawld sends, which the operator may change. Protego does the matching: longest match,
# `*` and `$` wildcards, Allow beating Disallow on ties; the stdlib robotparser gets both wrong.
#
# Firecrawl's leniencies are kept: one robots.txt per crawl from the start URL's origin; a fetch
# failure, an error status, or a body that is HTML, JSON or XML (a soft-404 page) means "allow
# all". One strictness is added as Firecrawl does: a path without a trailing slash is also checked
# with one, so `Disallow: /private/` keeps the crawl out of `/private` too. `/v2/scrape` never
# consults robots.txt; `ignoreRobotsTxt` makes the crawler skip `allowed`.
from __future__ import annotations

from protego import Protego
from yarl import URL

from daemon.crawl.content.document import decode_body, media_type
from daemon.crawl.fetching.fetch import Fetcher, FetchError
from daemon.crawl.fetching.urls import CrawlScope, parse_http_url

AGENTS = ("FirecrawlAgent", "FireCrawlAgent")
MAX_CRAWL_DELAY = 60.0
"""Longest Crawl-delay honoured, in seconds (the longest `delay` a crawl may ask for)."""
MAX_ROBOTS_BYTES = 512 * 1024
"""Bytes of robots.txt parsed (Google's limit); the rest is ignored."""

_NOT_ROBOTS_TYPES = (
    "text/html",
    "application/xhtml+xml",
    "application/json",
    "application/xml",
    "text/xml",
)


class Robots:
    """The robots.txt rules of one origin for Firecrawl's agent names."""

    def __init__(self, parser: Protego | None) -> None:
        self._parser = parser
        self.crawl_delay: float | None = None
        self.sitemaps: list[str] = []
        if parser is not None:
            delays = [d for d in (parser.crawl_delay(a) for a in AGENTS) if d is not None]
            self.crawl_delay = min(float(delays[0]), MAX_CRAWL_DELAY) if delays else None
            self.sitemaps = list(dict.fromkeys(parser.sitemaps))

    @classmethod
    def parse(cls, text: str) -> Robots:
        return cls(Protego.parse(text[:MAX_ROBOTS_BYTES]))

    @classmethod
    def allow_all(cls) -> Robots:
        return cls(None)

    def _allowed(self, url: str) -> bool:
        assert self._parser is not None
        return any(self._parser.can_fetch(url, agent) for agent in AGENTS)

    def allowed(self, url: str) -> bool:
        """Whether FirecrawlAgent (or FireCrawlAgent) may fetch `url`; `/p` must also be
        allowed as `/p/`."""
        if self._parser is None:
            return True
        if not self._allowed(url):
            return False
        try:
            path = URL(url).raw_path
        except ValueError:
            return True
        if path.endswith("/") or "." in path.rsplit("/", 1)[-1]:
            return True
        before, mark, query = url.split("#", 1)[0].partition("?")
        return self._allowed(f"{before}/{mark}{query}")


def _looks_like_markup(text: str) -> bool:
    head = text.lstrip()[:1]
    return head in ("<", "{", "[")


async def fetch_robots(fetcher: Fetcher, origin: str, *, timeout: float | None = None) -> Robots:
    """The robots.txt of `origin` ("http://host:port"); allow-all when it cannot be fetched,
    answers with an error status, or is HTML/JSON/XML rather than robots rules."""
    try:
        result = await fetcher.fetch(f"{origin.rstrip('/')}/robots.txt", timeout=timeout)
    except FetchError:
        return Robots.allow_all()
    if result.status_code >= 400 or media_type(result.content_type) in _NOT_ROBOTS_TYPES:
        return Robots.allow_all()
    text = decode_body(result.body[:MAX_ROBOTS_BYTES], result.content_type)
    if _looks_like_markup(text):
        return Robots.allow_all()
    return Robots.parse(text)


async def fetch_scope_robots(
    fetcher: Fetcher, scopes: dict[int, CrawlScope], robots: dict[int, Robots]
) -> None:
    """Put into `robots`, under the scope's key, the robots.txt of each scope's origin not there
    yet (the `/*` URLs of an extract or agent job: their links are checked against it)."""
    for key, scope in scopes.items():
        if key not in robots:
            parsed = parse_http_url(scope.start_url)
            assert parsed is not None
            robots[key] = await fetch_robots(fetcher, str(parsed.origin()))
