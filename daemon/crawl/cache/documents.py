# The document cache of the crawl API (docs/how-to/cache.md): one row per (URL, document-changing
# options) key in the store (table crawl_cache, migration 0015), so every instance of a cluster
# and every restart serves the same copies. What a request may read or write is decided by the
# pure rules of daemon/crawl/cache/rules.py; this module holds the statements (written once for
# both backends), the counters for /status and /metrics, and the pruning that keeps the table
# within `[crawl.cache]`'s bounds (oldest first). A store that fails never fails a page: a read
# that fails is a miss, a write that fails is skipped (both logged).
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

import msgspec
from prometheus_client import Counter, Gauge

from daemon.clock import EpochClock, wall_ms
from daemon.crawl.cache.rules import CachePlan, cache_key, cache_url, window
from daemon.crawl.config import CacheConfig
from daemon.logs import get_logger
from daemon.metrics import REGISTRY
from daemon.store import DB_ERRORS, Conn, Store, StoreClosed, in_list

log = get_logger("crawl")
_FAILURES: tuple[type[BaseException], ...] = (*DB_ERRORS, StoreClosed)
PRUNE_BATCH = 500

lookups = Counter(
    "crawld_crawl_cache_lookups",
    "Document cache lookups by result (hit, miss)",
    ["result"],
    registry=REGISTRY,
)
writes = Counter("crawld_crawl_cache_writes", "Documents written to the cache", registry=REGISTRY)
evictions = Counter(
    "crawld_crawl_cache_evictions",
    "Documents deleted from the cache by reason (age, size, admin)",
    ["reason"],
    registry=REGISTRY,
)
entries_gauge = Gauge(
    "crawld_crawl_cache_entries", "Documents in the cache (at the last prune)", registry=REGISTRY
)
bytes_gauge = Gauge(
    "crawld_crawl_cache_bytes",
    "Bytes of documents in the cache (at the last prune)",
    registry=REGISTRY,
)


class Cached(msgspec.Struct):
    """A stored page: its document (without cacheState / cachedAt), the links a crawl follows
    from it, the final URL and status of the fetch, and which engine produced it."""

    document: dict[str, Any]
    links: list[str]
    final_url: str
    status_code: int
    content_type: str
    engine: str


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Cached).decode


# -- statements ------------------------------------------------------------------------------


def read(conn: Conn, key: str, oldest_ms: int, newest_ms: int) -> tuple[str, int] | None:
    """(value JSON, created ms) of the entry of `key` created within [oldest, newest]."""
    row = conn.execute(
        "SELECT value, created_ms FROM crawl_cache WHERE key = ? AND created_ms >= ?"
        " AND created_ms <= ?",
        (key, oldest_ms, newest_ms),
    ).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


def read_many(
    conn: Conn, keys: list[str], oldest_ms: int, newest_ms: int
) -> dict[str, tuple[str, int]]:
    """`read` of several keys in one statement: {key: (value JSON, created ms)} of those found."""
    rows = conn.execute(
        f"SELECT key, value, created_ms FROM crawl_cache WHERE key IN {in_list(len(keys))}"
        " AND created_ms >= ? AND created_ms <= ?",
        (*keys, oldest_ms, newest_ms),
    ).fetchall()
    return {str(r[0]): (str(r[1]), int(r[2])) for r in rows}


def write(conn: Conn, key: str, url: str, value: str, now_ms: int) -> None:
    conn.execute(
        "INSERT INTO crawl_cache (key, url, created_ms, bytes, value) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT(key) DO UPDATE SET url = excluded.url, created_ms = excluded.created_ms,"
        " bytes = excluded.bytes, value = excluded.value",
        (key, url, now_ms, len(value.encode()), value),
    )


def totals(conn: Conn) -> tuple[int, int]:
    """(entries, bytes) of the whole cache."""
    row = conn.execute("SELECT count(*), coalesce(sum(bytes), 0) FROM crawl_cache").fetchone()
    return int(row[0]), int(row[1])


def delete_prefix(conn: Conn, prefix: str) -> int:
    """Delete every entry whose URL starts with `prefix`; how many went."""
    where, args = "substr(url, 1, CAST(? AS INTEGER)) = ?", (len(prefix), prefix)
    found = conn.execute(f"SELECT count(*) FROM crawl_cache WHERE {where}", args).fetchone()
    conn.execute(f"DELETE FROM crawl_cache WHERE {where}", args)
    return int(found[0])


def prune(conn: Conn, oldest_ms: int, max_entries: int, max_bytes: int) -> tuple[int, int]:
    """One batch of the bounds: entries older than `oldest_ms` first, then the oldest while
    over `max_entries` or `max_bytes`. (deleted for age, deleted for size); (0, 0): done."""
    aged = conn.execute(
        "SELECT key FROM crawl_cache WHERE created_ms < ? ORDER BY created_ms LIMIT ?",
        (oldest_ms, PRUNE_BATCH),
    ).fetchall()
    if aged:
        conn.executemany("DELETE FROM crawl_cache WHERE key = ?", [(r[0],) for r in aged])
        return len(aged), 0
    count, size = totals(conn)
    if count <= max_entries and size <= max_bytes:
        return 0, 0
    rows = conn.execute(
        "SELECT key, bytes FROM crawl_cache ORDER BY created_ms, key LIMIT ?", (PRUNE_BATCH,)
    ).fetchall()
    doomed = []
    for key, nbytes in rows:
        if count <= max_entries and size <= max_bytes:
            break
        doomed.append((key,))
        count, size = count - 1, size - int(nbytes)
    conn.executemany("DELETE FROM crawl_cache WHERE key = ?", doomed)
    return 0, len(doomed)


# -- the service -----------------------------------------------------------------------------


@dataclass
class Hit:
    page: Cached
    created_ms: int


class DocumentCache:
    """The cache as the page maker and the API use it."""

    def __init__(
        self, config: CacheConfig, store: Store | None, clock_ms: EpochClock = wall_ms
    ) -> None:
        self.config = config
        self.store = store
        self.clock_ms = clock_ms
        self.hits = 0
        self.misses = 0
        self.writes = 0
        self.evicted = 0

    @property
    def enabled(self) -> bool:
        return self.config.enabled and self.store is not None

    def configure(self, config: CacheConfig) -> None:
        self.config = config

    async def lookup(self, url: str, plan: CachePlan) -> Hit | None:
        """The copy `plan` may serve for `url`, counted as a hit or a miss (a plan that may not
        read, such as maxAge 0 or a changeTracking request, is not a lookup and counts
        nothing)."""
        if not plan.read:
            return None
        return (await self.lookup_many([url], plan))[url]

    async def lookup_many(self, urls: list[str], plan: CachePlan) -> dict[str, Hit | None]:
        """`lookup` of several URLs in one read of the store (a crawl's claimed rows): each
        URL's copy or None. Call it only with a plan that may read."""
        found: dict[str, Hit | None] = dict.fromkeys(urls)
        if self.enabled and urls:
            assert self.store is not None
            oldest, newest = window(plan, self.clock_ms())
            keys = {url: cache_key(url, plan) for url in urls}
            wanted = list(dict.fromkeys(keys.values()))
            try:
                rows = await self.store.read(lambda c: read_many(c, wanted, oldest, newest))
            except _FAILURES as exc:
                log.warning("document cache not readable; treated as a miss", error=str(exc))
                rows = {}
            for url, key in keys.items():
                if (row := rows.get(key)) is not None:
                    with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                        found[url] = Hit(_decode(row[0]), row[1])
        hits = sum(hit is not None for hit in found.values())
        self.hits += hits
        self.misses += len(found) - hits
        lookups.labels("hit").inc(hits)
        lookups.labels("miss").inc(len(found) - hits)
        return found

    async def remember(self, url: str, plan: CachePlan, page: Cached) -> None:
        if not (self.enabled and plan.write):
            return
        assert self.store is not None
        value = _encode(page).decode()
        if len(value) > self.config.max_bytes:
            return
        key, now = cache_key(url, plan), self.clock_ms()
        try:
            await self.store.write(lambda c: write(c, key, cache_url(url), value, now))
        except _FAILURES as exc:
            log.warning("document not cached", error=str(exc))
            return
        self.writes += 1
        writes.inc()

    async def delete(self, prefix: str) -> int:
        """Delete the entries whose URL starts with `prefix` (the admin route)."""
        if self.store is None:
            return 0
        deleted = int(await self.store.write(functools.partial(delete_prefix, prefix=prefix)))
        self.evicted += deleted
        evictions.labels("admin").inc(deleted)
        return deleted

    async def prune(self) -> int:
        """Apply `[crawl.cache]`'s bounds; how many entries went."""
        if self.store is None:
            return 0
        cfg = self.config
        oldest = self.clock_ms() - int(float(cfg.max_age) * 1000)
        gone = 0
        while True:
            aged, sized = await self.store.write(
                lambda c: prune(c, oldest, cfg.max_entries, cfg.max_bytes)
            )
            if not aged and not sized:
                break
            evictions.labels("age").inc(aged)
            evictions.labels("size").inc(sized)
            gone += aged + sized
        self.evicted += gone
        count, size = await self.store.read(totals)
        entries_gauge.set(count)
        bytes_gauge.set(size)
        return gone

    async def status(self) -> dict[str, Any]:
        entries = nbytes = None
        if self.store is not None:
            with contextlib.suppress(*_FAILURES):
                entries, nbytes = await self.store.read(totals)
        return {
            "enabled": self.enabled,
            "entries": entries,
            "bytes": nbytes,
            "hits": self.hits,
            "misses": self.misses,
            "writes": self.writes,
            "evicted": self.evicted,
            "max_bytes": self.config.max_bytes,
            "max_entries": self.config.max_entries,
        }
