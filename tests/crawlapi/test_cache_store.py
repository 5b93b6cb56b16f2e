"""The document cache's store half on both backends: the age window a plan may read, one row
per key, deletion by URL prefix, and the prune that keeps age, entry and byte bounds (oldest
first); plus the pure rules of what a request may read and write, and which options make the same
key."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from daemon.crawl.cache import rules
from daemon.crawl.cache.documents import Cached, DocumentCache
from daemon.crawl.config import CacheConfig
from daemon.crawl.options.scrape_options import SCRAPE_DEFAULTS, ScrapeOptions
from daemon.crawl.runs.pages import page_plan
from daemon.store import Store

DAY = 86_400_000


class Clock:
    def __init__(self) -> None:
        self.ms = 100 * DAY

    def __call__(self) -> int:
        return self.ms


def page(text: str = "x") -> Cached:
    return Cached(document={"markdown": text, "metadata": {"statusCode": 200}}, links=["l"],
                  final_url="http://a.test/final", status_code=200, content_type="text/html",
                  engine="http")  # fmt: skip


def plan(**options: Any) -> rules.CachePlan:
    return rules.cache_plan({"formats": ["markdown"], **options})


async def test_window_one_row_per_key_and_prefix_delete(store: Store) -> None:
    clock = Clock()
    cache = DocumentCache(CacheConfig(), store, clock)
    await cache.remember("http://a.test/1", plan(), page("old"))
    clock.ms += 1000
    await cache.remember("http://a.test/1", plan(), page("new"))
    hit = await cache.lookup("http://a.test/1#frag", plan())
    assert hit is not None and hit.page.document["markdown"] == "new" and hit.created_ms == clock.ms
    assert hit.page.links == ["l"] and hit.page.final_url == "http://a.test/final"
    assert await cache.lookup("http://a.test/1", plan(onlyMainContent=False)) is None
    clock.ms += 3 * DAY
    assert await cache.lookup("http://a.test/1", plan()) is None  # older than 2 days
    assert await cache.lookup("http://a.test/1", plan(maxAge=4 * DAY)) is not None
    assert await cache.lookup("http://a.test/1", plan(minAge=4 * DAY)) is None
    assert await cache.lookup("http://a.test/1", plan(lockdown=True)) is not None
    await cache.remember("http://a.test/2", plan(), page())
    await cache.remember("http://b.test/1", plan(), page())
    assert (await cache.status())["entries"] == 3
    assert await cache.delete("http://a.test/") == 2
    assert (await cache.status())["entries"] == 1
    assert (cache.hits, cache.misses) == (3, 3)


async def test_prune_keeps_the_bounds_oldest_first(store: Store) -> None:
    clock = Clock()
    cfg = CacheConfig(max_entries=3, max_bytes=1024 * 1024)
    cache = DocumentCache(cfg, store, clock)
    for i in range(6):
        clock.ms += 1000
        await cache.remember(f"http://a.test/{i}", plan(), page())
    assert await cache.prune() == 3
    kept = [i for i in range(6) if await cache.lookup(f"http://a.test/{i}", plan()) is not None]
    assert kept == [3, 4, 5]
    big = "y" * 400_000
    cache.configure(CacheConfig(max_entries=100, max_bytes=1024 * 1024))
    for i in range(3):
        clock.ms += 1000
        await cache.remember(f"http://big.test/{i}", plan(), page(big))
    assert await cache.prune() == 4  # three small and the oldest big one: under 1 MiB again
    status = await cache.status()
    assert status["entries"] == 2 and status["bytes"] <= 1024 * 1024
    clock.ms += 31 * DAY  # beyond max_age: everything goes
    assert await cache.prune() == 2 and (await cache.status())["entries"] == 0


async def test_disabled_cache_neither_reads_nor_writes(store: Store) -> None:
    cache = DocumentCache(CacheConfig(enabled=False), store, Clock())
    await cache.remember("http://a.test/", plan(), page())
    assert await cache.lookup("http://a.test/", plan()) is None
    assert (await cache.status())["entries"] == 0


def test_what_a_request_may_read_and_write() -> None:
    default = plan()
    assert (default.read, default.write, default.max_age_ms, default.only) == (
        True, True, rules.DEFAULT_MAX_AGE_MS, None)  # fmt: skip
    assert not plan(maxAge=0).read and plan(maxAge=0).write
    assert plan(minAge=1).only == rules.NO_CACHED_DATA
    locked = plan(lockdown=True)
    assert (locked.only, locked.write, locked.max_age_ms) == (
        rules.LOCKDOWN_MISS, False, rules.LOCKDOWN_MAX_AGE_MS)  # fmt: skip
    assert not plan(storeInCache=False).write and plan(storeInCache=False).read
    assert not rules.cache_plan({"formats": ["markdown"]}, zero_data_retention=True).write
    for excluded in ({"headers": {"A": "1"}}, {"actions": [{"type": "wait"}]},
                     {"formats": ["markdown", {"type": "changeTracking"}]},
                     {"parsers": [{"type": "pdf", "maxPages": 2}]}):  # fmt: skip
        options = {"formats": ["markdown"], **excluded}
        assert rules.uncacheable(options) is not None, excluded
        p = rules.cache_plan(options)
        assert not p.read and not p.write
    assert rules.cache_key("http://a.test/", plan(timeout=5000, maxAge=1)) == rules.cache_key(
        "http://a.test/#x", plan()
    )
    assert rules.storable(200, {"markdown": "x"}) and not rules.storable(404, {})
    assert not rules.storable(200, {"warning": "JSON extraction failed: LLM_TIMEOUT: …"})
    json_a = plan(formats=[{"type": "json", "prompt": "a"}])
    json_b = plan(formats=[{"type": "json", "prompt": "b"}])
    assert rules.cache_key("http://a.test/", json_a) != rules.cache_key("http://a.test/", json_b)
    asked = [plan(formats=[{"type": "question", "question": q}]) for q in ("a?", "b?", "a?")]
    keys = [rules.cache_key("http://a.test/", p) for p in asked]
    assert keys[0] != keys[1] and keys[0] == keys[2]  # another question is another document


SDK_DEFAULTS = {"onlyMainContent": True, "removeBase64Images": True, "fastMode": False,
                "blockAds": True, "storeInCache": True, "maxAge": 14_400_000, "mobile": False}  # fmt: skip
"""What firecrawl-py 4.55 adds to every scrape that sets any option."""
SAME_KEY = [  # (one request's options, another's, the same document?)
    ({}, SDK_DEFAULTS, True),
    ({}, {**SDK_DEFAULTS, "formats": ["markdown"], "lockdown": True, "maxAge": 1}, True),
    ({}, {"formats": [{"type": "markdown"}], "proxy": "auto", "mobile": None}, True),
    ({"formats": ["markdown", "links"]}, {"formats": ["links", {"type": "markdown"}]}, True),
    ({}, {"waitFor": 0, "includeTags": [], "excludeTags": [], "headers": {}}, True),
    ({}, {"timeout": 9000, "minAge": 1, "integration": "x", "skipTlsVerification": False}, True),
    ({}, {"redactPII": False, "checkPromptInjection": False, "domainTools": False}, True),
    ({}, {"mobile": True}, False),
    ({}, {"blockAds": False}, False),
    ({}, {"onlyMainContent": False}, False),
    ({}, {"removeBase64Images": False}, False),
    ({}, {"proxy": "stealth"}, False),
    ({}, {"waitFor": 1000}, False),
    ({}, {"formats": ["markdown", "links"]}, False),
    ({}, {"location": {"languages": ["de"]}}, False),
    (SDK_DEFAULTS, {**SDK_DEFAULTS, "mobile": True}, False),
]


def parsed_key(raw: dict[str, Any]) -> str:
    """The cache key of a request's options as the API parses and plans them."""
    options = msgspec.convert(raw, ScrapeOptions)
    cache = page_plan(options, 30.0).cache
    assert cache is not None
    return rules.cache_key("http://a.test/", cache)


@pytest.mark.parametrize(("one", "other", "same"), SAME_KEY)
def test_an_option_at_its_default_is_the_option_left_out(
    one: dict[str, Any], other: dict[str, Any], same: bool
) -> None:
    assert (parsed_key(one) == parsed_key(other)) is same
    plain = [rules.cache_plan(o, defaults=SCRAPE_DEFAULTS).key_options for o in (one, other)]
    assert (plain[0] == plain[1]) is same  # the same rule over plain values


def test_every_option_with_a_default_is_keyed_as_when_absent() -> None:
    assert {"mobile", "blockAds", "onlyMainContent", "removeBase64Images", "proxy",
            "formats", "waitFor"} <= set(SCRAPE_DEFAULTS)  # fmt: skip
    for name, value in SCRAPE_DEFAULTS.items():
        assert parsed_key({name: value}) == parsed_key({}), name
