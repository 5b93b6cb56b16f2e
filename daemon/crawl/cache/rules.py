# What the document cache (daemon/crawl/cache/documents.py) does for one request, decided once per
# job from its validated scrape options, as Firecrawl v2 decides it for its index: `maxAge` bounds
# the age of a copy that may be served (2 days when unset; `maxAge: 0` never reads), `minAge` and
# `lockdown` serve from the cache only (a miss is a 404, nothing is fetched), `storeInCache:
# false`, zero data retention and lockdown never write. Requests whose page depends on more than
# the URL and the options (actions, custom headers, changeTracking, PDF page limits) neither read
# nor write, as Firecrawl skips its index for them.
#
# The key is the URL (without its #fragment) and every option that changes the document: the
# options are all taken, except those that only say how long to wait or how to cache, so an
# option added later is in the key unless it is listed here as harmless. An option given with
# its default value is the same request as one that leaves it out (firecrawl-py sends
# `mobile: false, blockAds: true, ...` with every scrape that sets any option; a bare `{url}`
# sends none): the key holds only the options that differ from the defaults the option parser
# applies, which the caller passes in (daemon/crawl/options/scrape_options.py SCRAPE_DEFAULTS,
# a later room).
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import msgspec

DEFAULT_MAX_AGE_MS = 2 * 86_400_000
"""Firecrawl v2's maxAge when the request gives none (two days)."""
LOCKDOWN_MAX_AGE_MS = 2 * 365 * 86_400_000
"""maxAge of a lockdown request that gives none (two years, Firecrawl's)."""
NO_CACHED_DATA = "SCRAPE_NO_CACHED_DATA"
LOCKDOWN_MISS = "SCRAPE_LOCKDOWN_CACHE_MISS"
MISS_MESSAGES = {
    NO_CACHED_DATA: "No cached data is available for this request (minAge asks for a cached copy"
    " only and none old enough is kept).",
    LOCKDOWN_MISS: "No cached data is available for this request in lockdown mode. Lockdown"
    " serves from the cache only and never fetches the page: scrape it once without lockdown.",
}
NOT_IN_KEY = frozenset(
    {"timeout", "maxAge", "minAge", "storeInCache", "lockdown", "integration", "origin",
     "zeroDataRetention", "auditMetadata", "fastMode", "useMock", "skipTlsVerification"}
)  # fmt: skip
"""Options that never change a produced document (only whether or how long it is waited for,
or whether it may be kept): never in the key, whatever their value."""


class CachePlan(msgspec.Struct, frozen=True):
    """The cache's part of a job's page plan."""

    key_options: str
    """Canonical JSON of the options in the key (the URL is added per page)."""
    read: bool
    """Look for a copy at all."""
    write: bool
    """Store what is produced live."""
    max_age_ms: int
    min_age_ms: int = 0
    only: str | None = None
    """NO_CACHED_DATA or LOCKDOWN_MISS: cache only, a miss is this 404."""


def _format_names(formats: list[Any]) -> set[str]:
    return {f if isinstance(f, str) else str(f.get("type")) for f in formats}


def uncacheable(options: dict[str, Any]) -> str | None:
    """Why a request's pages are never cached (None: they may be)."""
    if options.get("actions"):
        return "actions"
    if options.get("headers"):
        return "headers"
    if "changeTracking" in _format_names(options.get("formats") or []):
        return "changeTracking"
    for parser in options.get("parsers") or []:
        if isinstance(parser, dict) and parser.get("maxPages") is not None:
            return "parsers.maxPages"
    if options.get("profile"):
        return "profile"
    return None


def _canonical_formats(formats: Any) -> Any:
    """Formats as one request means them: `{"type": "links"}` is `"links"`, order is not."""
    if not isinstance(formats, list):
        return formats
    named = [f["type"] if isinstance(f, dict) and list(f) == ["type"] else f for f in formats]
    return sorted(named, key=lambda f: msgspec.json.encode(f, order="sorted"))


def key_options(options: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The options in the key: neither unset (None), nor in NOT_IN_KEY, nor equal to their
    default in `defaults` (an explicit default is the same request as the option left out)."""
    keyed: dict[str, Any] = {}
    for name, value in options.items():
        if name in NOT_IN_KEY or value is None:
            continue
        default = defaults.get(name)
        if name == "formats":
            value, default = _canonical_formats(value), _canonical_formats(default)
        if type(value) is type(default) and value == default:
            continue
        keyed[name] = value
    return keyed


def cache_plan(
    options: dict[str, Any],
    *,
    defaults: Mapping[str, Any] | None = None,
    zero_data_retention: bool = False,
) -> CachePlan:
    """The plan of validated scrape options given as plain values (msgspec.to_builtins of
    ScrapeOptions); `defaults`: the parser's default of each option (SCRAPE_DEFAULTS), left out
    of the key. v1 requests arrive with v1's default maxAge (0) already set."""
    lockdown = bool(options.get("lockdown"))
    min_age = options.get("minAge")
    max_age = options.get("maxAge")
    if max_age is None:
        max_age = LOCKDOWN_MAX_AGE_MS if lockdown else DEFAULT_MAX_AGE_MS
    only = LOCKDOWN_MISS if lockdown else (NO_CACHED_DATA if min_age is not None else None)
    excluded = uncacheable(options) is not None
    keyed = key_options(options, defaults or {})
    return CachePlan(
        key_options=msgspec.json.encode(keyed, order="sorted").decode(),
        read=not excluded and (max_age > 0 or only is not None),
        write=not excluded
        and options.get("storeInCache") is not False
        and not zero_data_retention
        and not lockdown,
        max_age_ms=int(max_age),
        min_age_ms=int(min_age or 0),
        only=only,
    )


def cache_url(url: str) -> str:
    """The URL as the cache knows it: without its #fragment."""
    return url.strip().split("#", 1)[0]


def cache_key(url: str, plan: CachePlan) -> str:
    return hashlib.sha256(f"{cache_url(url)}\n{plan.key_options}".encode()).hexdigest()


def window(plan: CachePlan, now_ms: int) -> tuple[int, int]:
    """(oldest, newest) creation time in ms of a copy that may be served."""
    oldest = now_ms - plan.max_age_ms if plan.max_age_ms > 0 else 0
    return oldest, now_ms - plan.min_age_ms


def storable(status_code: int, document: dict[str, Any]) -> bool:
    """Only successful pages are kept (Firecrawl serves the newest 2xx), and only whole ones:
    a document with a `warning` (a failed LLM call, a render that fell back to the HTML) would
    serve its degraded result for as long as maxAge allows."""
    return 200 <= status_code < 300 and "warning" not in document
