# Every decision of a web search as plain functions, tested with plain values: which SearXNG
# parameters a Firecrawl search becomes, how SearXNG's results become Firecrawl's `web`, `news`
# and `images` items, and which results a domain filter keeps. What SearXNG cannot take
# (`location`, a custom `tbs` range) is reported as a warning, never dropped silently.
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


def query_text(q: SearchQuery) -> str:
    """The query sent: with `site:` for one included domain and `filetype:pdf` for `pdf`."""
    text = q.query.strip()
    if len(q.include_domains) == 1:
        text += f" site:{q.include_domains[0]}"
    if "github" in q.categories:
        text += " site:github.com"
    if "pdf" in q.categories:
        text += " filetype:pdf"
    return text


def language(q: SearchQuery) -> str:
    """SearXNG's `language`: a locale like "en-US" when a country is given, else the language."""
    lang = (q.lang or "").strip()
    if lang and q.country and "-" not in lang:
        return f"{lang}-{q.country.strip().upper()}"
    return lang or "all"


def params(q: SearchQuery, source: str, pageno: int, engines: list[str]) -> dict[str, str]:
    """The query string of one SearXNG `/search` request."""
    out = {
        "q": query_text(q),
        "format": "json",
        "pageno": str(pageno),
        "categories": CATEGORY_OF_SOURCE[source],
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


def allowed(url: str, q: SearchQuery) -> bool:
    """Whether a result's URL passes the request's domain filters and categories."""
    host = host_of(url)
    if not host:
        return False
    include = tuple(d.lower().strip(".") for d in q.include_domains)
    exclude = tuple(d.lower().strip(".") for d in q.exclude_domains)
    if include and not _under(host, include):
        return False
    if exclude and _under(host, exclude):
        return False
    if "github" in q.categories and not _under(host, ("github.com",)):
        return False
    return not ("research" in q.categories and not _under(host, RESEARCH_SITES))


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
        if url in hit.seen or not allowed(url, q):
            continue
        hit.seen.add(url)
        item["position"] = len(hit.items) + 1
        hit.items.append(item)
    return len(results)
