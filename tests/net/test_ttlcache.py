from __future__ import annotations

from daemon.net.ttlcache import TtlCache


def test_entries_expire_after_ttl_and_the_least_recently_used_go_first() -> None:
    cache: TtlCache[str, int] = TtlCache(ttl=10, max_entries=2)
    cache.put("a", 1, now=0)
    cache.put("b", 2, now=0)
    assert cache.get("a", now=9.9) == 1  # "a" is now the most recently used
    cache.put("c", 3, now=1)
    assert (cache.get("b", now=2), cache.get("a", now=2), cache.get("c", now=2)) == (None, 1, 3)
    assert cache.get("a", now=10) is None and len(cache) == 1  # expired, and dropped
    cache.put("c", 4, now=5)  # a put starts the entry's time again
    assert cache.get("c", now=14.9) == 4 and cache.get("c", now=15) is None
