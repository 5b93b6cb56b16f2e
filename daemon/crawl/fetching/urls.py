# Which URLs a crawl visits, and when two URLs are "the same page", are pure rules over strings,
# kept apart from fetching so they can be tested as tables and applied identically to links,
# sitemap entries and every redirect hop. They follow Firecrawl's v2 crawler (the users of this
# API expect its behaviour): a dedupe key that drops the fragment and keeps the query in its
# original order, scope checks in Firecrawl's order, and includePaths/excludePaths as unanchored
# regexes on the path.
#
# Firecrawl runs those regexes with Rust's `regex` crate: linear time, no look-around, no
# backreferences. RE2 (`google-re2`) has the same syntax family and the same guarantee, so a
# user's pattern cannot stall the crawler with catastrophic backtracking, and a pattern Firecrawl
# would refuse is refused here too. Registrable domains come from `publicsuffixlist`, which ships
# the Public Suffix List inside the package (no network at run time).
from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable
from typing import Any

import msgspec
import re2
from publicsuffixlist import PublicSuffixList
from yarl import URL

MAX_PATTERN_LENGTH = 1000
MAX_PATTERNS = 100

REFUSED_EXTENSIONS = frozenset(
    [
        "png",
        "jpg",
        "jpeg",
        "gif",
        "css",
        "js",
        "ico",
        "svg",
        "tiff",
        "zip",
        "exe",
        "dmg",
        "mp4",
        "mp3",
        "wav",
        "avi",
        "flv",
        "woff",
        "ttf",
        "woff2",
        "webp",
        "inc",
    ]
)
"""File extensions a crawl never follows (Firecrawl's list, less pptx and xlsx: office documents
are read, daemon/crawl/documents/; images are OCR'd when scraped, never followed by a crawl)."""

SOCIAL_OR_EMAIL_HOSTS = (
    "facebook.com",
    "twitter.com",
    "x.com",
    "linkedin.com",
    "instagram.com",
    "pinterest.com",
    "github.com",
    "calendly.com",
    "discord.gg",
    "discord.com",
)
"""External hosts whose links are never followed, even with allowExternalLinks."""

_INDEX_PAGES = ("/index.html", "/index.php")
_PSL = PublicSuffixList()
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


def parse_http_url(url: str) -> URL | None:
    """`url` as an absolute http(s) URL with a host, or None."""
    try:
        parsed = URL(url)
    except (ValueError, TypeError):
        return None
    if parsed.scheme not in ("http", "https") or not parsed.raw_host:
        return None
    return parsed


def strip_www(host: str) -> str:
    return host[4:] if host.startswith("www.") else host


def registrable_domain(host: str) -> str:
    """The registrable domain of `host` ("blog.example.co.uk" -> "example.co.uk"); the host
    itself for an IP address or a name under no known suffix."""
    host = host.lower().rstrip(".")
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return _PSL.privatesuffix(host) or host
    return host


def dedupe_key(url: str, *, ignore_query: bool, similar: bool) -> str:
    """The key under which a crawl fetches a URL at most once.

    The fragment is dropped; the query is kept as written (order included) unless
    `ignore_query`. With `similar` (deduplicateSimilarURLs), www/non-www, http/https, a
    trailing slash and a final /index.html or /index.php collapse to one key.
    """
    parsed = URL(url).with_fragment(None)
    if ignore_query:
        parsed = parsed.with_query(None)
    if not similar:
        return str(parsed)
    path = parsed.raw_path
    for index in _INDEX_PAGES:
        if path.endswith(index):
            path = path[: -len(index) + 1]
            break
    path = path.rstrip("/")
    host = strip_www(parsed.raw_host or "")
    port = "" if parsed.is_default_port() else f":{parsed.explicit_port}"
    query = f"?{parsed.raw_query_string}" if parsed.raw_query_string else ""
    return f"//{host}{port}{path}{query}"


def refused_extension(url: str) -> bool:
    """Whether the URL's last path segment ends in an extension a crawl never follows."""
    parsed = parse_http_url(url)
    name = (parsed.raw_path if parsed is not None else url).rsplit("/", 1)[-1]
    if "." not in name:
        return False
    return name.rsplit(".", 1)[1].lower() in REFUSED_EXTENSIONS


def compile_paths(patterns: Iterable[str], *, field: str = "includePaths") -> tuple[Any, ...]:
    """Compile includePaths/excludePaths patterns with RE2 (Rust-regex syntax: no
    look-around, no backreferences). Raises ValueError naming the field and the bad pattern."""
    patterns = tuple(patterns)
    if len(patterns) > MAX_PATTERNS:
        raise ValueError(f"{field}: at most {MAX_PATTERNS} patterns")
    compiled = []
    for index, pattern in enumerate(patterns):
        if not isinstance(pattern, str):
            raise ValueError(f"{field}[{index}]: must be a string")
        if len(pattern) > MAX_PATTERN_LENGTH:
            raise ValueError(f"{field}[{index}]: longer than {MAX_PATTERN_LENGTH} characters")
        try:
            compiled.append(re2.compile(pattern, _RE2_OPTIONS))
        except re2.error as exc:
            message = exc.args[0] if exc.args else exc
            if isinstance(message, bytes):
                message = message.decode("utf-8", "replace")
            raise ValueError(
                f"{field}[{index}]: invalid regex {pattern[:100]!r}: {message}"
            ) from None
    return tuple(compiled)


@functools.lru_cache(maxsize=256)
def _compiled(patterns: tuple[str, ...], field: str) -> tuple[Any, ...]:
    return compile_paths(patterns, field=field)


def is_social_or_email(url: str) -> bool:
    if url.lower().startswith("mailto:"):
        return True
    parsed = parse_http_url(url)
    if parsed is None:
        return False
    host = (parsed.raw_host or "").lower()
    return any(host == h or host.endswith("." + h) for h in SOCIAL_OR_EMAIL_HOSTS)


class CrawlScope(msgspec.Struct, frozen=True):
    """The scope options of one crawl; `refusal(url)` applies them to a discovered URL."""

    start_url: str
    include_paths: tuple[str, ...] = ()
    exclude_paths: tuple[str, ...] = ()
    regex_on_full_url: bool = False
    crawl_entire_domain: bool = False
    allow_subdomains: bool = False
    allow_external_links: bool = False
    max_url_depth: int | None = None
    """v1's maxDepth: most path segments a followed URL may have (None: no limit)."""

    def is_internal(self, url: str) -> bool:
        """Same host as the start URL, ignoring a leading `www.`."""
        parsed = parse_http_url(url)
        start = parse_http_url(self.start_url)
        if parsed is None or start is None:
            return False
        return strip_www(parsed.raw_host or "") == strip_www(start.raw_host or "")

    def refusal(self, url: str) -> str | None:
        """None when the crawl may follow `url`, else the reason it may not.

        Order (Firecrawl's): http(s) only; internal links with `#` refused unless `#/route`;
        external links: social/email hosts refused, allowed with allowExternalLinks (never an
        external home page) or allowSubdomains (same registrable domain); excludePaths, then
        includePaths (unanchored, on the path or the full URL with regexOnFullURL); the
        start URL's path prefix unless crawlEntireDomain (not for external links); refused
        file extensions. robots.txt is the crawler's check, not the scope's, and so is
        Firecrawl's "one hop" for external pages (follow no links of a page for which
        `is_internal` is false). Patterns must have passed `compile_paths` (the request's
        validation); an invalid one raises ValueError here.
        """
        parsed = parse_http_url(url)
        start = parse_http_url(self.start_url)
        if parsed is None or start is None:
            return "not an http(s) URL"
        host = strip_www(parsed.raw_host or "")
        start_host = strip_www(start.raw_host or "")
        external = False
        if host == start_host:
            if "#" in url and "#/" not in url:
                return "link to a section of a page (#fragment)"
        elif is_social_or_email(url):
            return "social media or email link"
        elif self.allow_subdomains and registrable_domain(host) == registrable_domain(start_host):
            pass
        elif self.allow_external_links:
            if parsed.raw_path in ("", "/") and not parsed.raw_query_string:
                return "home page of an external site"
            external = True
        else:
            return "outside the crawl's domain"
        if self.max_url_depth is not None and (
            len([s for s in parsed.raw_path.split("/") if s]) > self.max_url_depth
        ):
            return "URL depth exceeds the specified maxDepth"
        target = str(parsed) if self.regex_on_full_url else parsed.raw_path
        for pattern in _compiled(self.exclude_paths, "excludePaths"):
            if pattern.search(target):
                return f"matches excludePaths {pattern.pattern!r}"
        if self.include_paths and not any(
            p.search(target) for p in _compiled(self.include_paths, "includePaths")
        ):
            return "matches no includePaths pattern"
        if (
            not external
            and not self.crawl_entire_domain
            and not parsed.raw_path.startswith(start.raw_path)
        ):
            return f"outside the start path {start.raw_path} (crawlEntireDomain is off)"
        if refused_extension(url):
            return "file type not crawled"
        return None
