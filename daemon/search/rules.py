# Every decision of a web search as plain functions, tested with plain values: which SearXNG
# parameters a Firecrawl search becomes, how SearXNG's results become Firecrawl's `web`, `news`
# and `images` items, and which results a domain filter keeps. What SearXNG cannot take
# (`location`, a custom `tbs` range) is reported as a warning, never dropped silently.
#
# Categories narrow the web results only (as Firecrawl's): each of github, research, developer and
# gov is a list of sites a result must be on (any requested category admits a result, which then
# carries its `category`), some with a query operator that helps the engines find them; pdf adds
# `filetype:pdf`. developer also asks SearXNG's "it" engines (its GitHub, Stack Overflow, package
# index and documentation engines) beside the general ones.
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

SOURCES = ("web", "news", "images")
CATEGORY_OF_SOURCE = {"web": "general", "news": "news", "images": "images"}
"""The SearXNG category asked for each Firecrawl source type (as Firecrawl's SearXNG adapter)."""

TIME_RANGES = {"qdr:h": "day", "qdr:d": "day", "qdr:w": "week", "qdr:m": "month", "qdr:y": "year"}
"""Firecrawl's `tbs` values SearXNG can take (it has no hour range: `qdr:h` asks for a day)."""

RESEARCH_SITES = (
    "arxiv.org", "pubmed.ncbi.nlm.nih.gov", "nature.com", "science.org", "ieee.org",
    "sciencedirect.com", "biorxiv.org", "medrxiv.org", "springer.com", "acm.org",
    "semanticscholar.org", "jstor.org", "plos.org", "ncbi.nlm.nih.gov",
)  # fmt: skip
"""Sites the `research` category keeps (Firecrawl's list of academic sites, as its SDK says)."""

DEVELOPER_SITES = (
    "github.com", "gitlab.com", "codeberg.org", "bitbucket.org", "sourceforge.net",
    "stackoverflow.com", "stackexchange.com", "serverfault.com", "superuser.com", "askubuntu.com",
    "readthedocs.io", "readthedocs.org", "docs.rs", "crates.io", "pkg.go.dev", "pypi.org",
    "npmjs.com", "developer.mozilla.org", "docs.python.org", "learn.microsoft.com",
    "developer.apple.com", "developer.android.com", "hub.docker.com", "wiki.archlinux.org",
)  # fmt: skip
"""Sites the `developer` category keeps: code hosts (issues, pull requests, READMEs), Q&A sites,
package indexes and documentation sites, in place of Firecrawl's developer index."""

GOV_DOMAINS = ("gov", "mil", "fed.us")
"""Domains the `gov` category keeps: US government sites, in place of Firecrawl's government
index (which is about US material too)."""

HOST_CATEGORIES: dict[str, tuple[str, ...]] = {
    "github": ("github.com",),
    "research": RESEARCH_SITES,
    "developer": DEVELOPER_SITES,
    "gov": GOV_DOMAINS,
}
"""The categories that keep web results on some sites only."""
QUERY_OPERATORS = {"github": "site:github.com", "gov": "site:gov", "pdf": "filetype:pdf"}
"""What a category adds to the web query (engines that know the operator search those only)."""
EXTRA_SEARXNG_CATEGORIES = {"developer": "it"}
"""SearXNG categories a category asks besides the source's own."""

Item = dict[str, Any]


class SearchError(Exception):
    """The provider failed: `code` is Firecrawl-style, `status` the HTTP status to answer."""

    def __init__(self, code: str, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.retry = False
        """Worth another try (a timeout, a refused connection, 429, 5xx)."""


@dataclass(frozen=True)
class SearchQuery:
    """A validated search, as the provider needs it."""

    query: str
    sources: tuple[str, ...] = ("web",)
    limit: int = 10
    lang: str = "en"
    country: str | None = None
    tbs: str | None = None
    safe: bool = False
    include_domains: tuple[str, ...] = ()
    exclude_domains: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    location: str | None = None


@dataclass
class Hit:
    """One source type's results so far (items in provider order, URLs seen)."""

    source: str
    items: list[Item] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    exhausted: bool = False


def warnings(q: SearchQuery) -> list[str]:
    """What the provider cannot honour, said once per search."""
    out = []
    if q.location:
        out.append("location is not sent to SearXNG: results are not localized by place")
    if q.tbs and q.tbs not in TIME_RANGES:
        out.append(f"tbs {q.tbs[:40]!r} is not a range SearXNG takes (qdr:d, w, m, y): ignored")
    return out


def query_text(q: SearchQuery, source: str = "web") -> str:
    """The query sent: with `site:` for one included domain and, for web, the categories'
    operators (QUERY_OPERATORS)."""
    text = q.query.strip()
    if len(q.include_domains) == 1:
        text += f" site:{q.include_domains[0]}"
    if source == "web":
        text += "".join(f" {QUERY_OPERATORS[c]}" for c in q.categories if c in QUERY_OPERATORS)
    return text


def searxng_categories(q: SearchQuery, source: str) -> str:
    """SearXNG's `categories` for one source: its own, and for web those the categories add."""
    names = [CATEGORY_OF_SOURCE[source]]
    if source == "web":
        names += [
            EXTRA_SEARXNG_CATEGORIES[c] for c in q.categories if c in EXTRA_SEARXNG_CATEGORIES
        ]
    return ",".join(dict.fromkeys(names))


def language(q: SearchQuery) -> str:
    """SearXNG's `language`: a locale like "en-US" when a country is given, else the language."""
    lang = (q.lang or "").strip()
    if lang and q.country and "-" not in lang:
        return f"{lang}-{q.country.strip().upper()}"
    return lang or "all"


def params(q: SearchQuery, source: str, pageno: int, engines: list[str]) -> dict[str, str]:
    """The query string of one SearXNG `/search` request."""
    out = {
        "q": query_text(q, source),
        "format": "json",
        "pageno": str(pageno),
        "categories": searxng_categories(q, source),
        "language": language(q),
        "safesearch": "2" if q.safe else "0",
    }
    if q.tbs in TIME_RANGES:
        out["time_range"] = TIME_RANGES[q.tbs]
    if engines:
        out["engines"] = ",".join(engines)
    return out


def host_of(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower().rstrip(".")
    except ValueError:
        return ""


def _under(host: str, domains: tuple[str, ...]) -> bool:
    return any(host == d or host.endswith("." + d) for d in domains)


def category_of(host: str, categories: tuple[str, ...]) -> str | None:
    """The first of `categories` whose sites hold `host` (None: none does)."""
    for name in categories:
        if name in HOST_CATEGORIES and _under(host, HOST_CATEGORIES[name]):
            return name
    return None


def allowed(url: str, q: SearchQuery, source: str = "web") -> bool:
    """Whether a result's URL passes the request's domain filters and, for web, categories."""
    host = host_of(url)
    if not host:
        return False
    include = tuple(d.lower().strip(".") for d in q.include_domains)
    exclude = tuple(d.lower().strip(".") for d in q.exclude_domains)
    if include and not _under(host, include):
        return False
    if exclude and _under(host, exclude):
        return False
    if source != "web" or not any(c in HOST_CATEGORIES for c in q.categories):
        return True
    return category_of(host, q.categories) is not None


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _size(resolution: Any) -> tuple[int | None, int | None]:
    """SearXNG's image `resolution` ("1920x1080", "1920 x 1080") as (width, height)."""
    if not isinstance(resolution, str):
        return None, None
    parts = resolution.lower().replace(" ", "").split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None, None
    return int(parts[0]), int(parts[1])


def to_item(result: Any, source: str) -> tuple[str, Item] | None:
    """A SearXNG result as a Firecrawl item of `source` (without its position), keyed by its
    URL; None for a result without an http(s) URL."""
    if not isinstance(result, dict):
        return None
    url = _text(result.get("url"))
    if url is None or not url.lower().startswith(("http://", "https://")):
        return None
    title = _text(result.get("title"))
    if source == "images":
        image = _text(result.get("img_src")) or _text(result.get("thumbnail_src"))
        width, height = _size(result.get("resolution"))
        item: Item = {"title": title, "imageUrl": image, "url": url,
                      "imageWidth": width, "imageHeight": height}  # fmt: skip
    elif source == "news":
        date = _text(result.get("publishedDate")) or _text(result.get("pubdate"))
        item = {"title": title, "url": url, "snippet": _text(result.get("content")) or "",
                "date": date, "imageUrl": _text(result.get("thumbnail"))}  # fmt: skip
    else:
        item = {"url": url, "title": title or url,
                "description": _text(result.get("content")) or ""}  # fmt: skip
    return url, {k: v for k, v in item.items() if v is not None}


def add_page(hit: Hit, results: Any, q: SearchQuery) -> int:
    """Add one provider page's results to `hit` (mapped, filtered, de-duplicated, up to the
    limit); returns how many results the page had (0: the provider has no more)."""
    if not isinstance(results, list):
        return 0
    for result in results:
        if len(hit.items) >= q.limit:
            break
        mapped = to_item(result, hit.source)
        if mapped is None:
            continue
        url, item = mapped
        if url in hit.seen or not allowed(url, q, hit.source):
            continue
        hit.seen.add(url)
        if hit.source == "web" and (category := category_of(host_of(url), q.categories)):
            item["category"] = category
        item["position"] = len(hit.items) + 1
        hit.items.append(item)
    return len(results)
