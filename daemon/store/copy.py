# `crawld store copy FROM_CONFIG TO_CONFIG`: move a stopped deployment's store into the empty
# store of another config (SQLite → PostgreSQL when a user outgrows one host, or back).
#
# Why this shape: the copy runs on plain backend connections, outside the trio store, because it
# is one long batch and nothing else may run meanwhile: both ends are held (the source's state
# dir lock or "no other crawld connected", the same for the target), the target is migrated and
# must be empty, and every row goes in ONE target transaction, so a failure leaves the target as
# empty as it was. Tables kept by triggers (a video's latest snapshot, schedule counts per type
# and status, pending schedules per window) are not copied: the target's triggers rebuild them
# from the copied rows, which also proves them. Values are coerced to the target column's kind
# (an older SQLite file may hold JSON bytes in a TEXT column). Counts are compared at the end.
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from daemon.store import Backend

COPY_ORDER = (
    "tracker_settings",
    "outbox_streams",
    "jobs",
    "job_rows",
    "job_errors",
    "outbox_items",
    "webhook_gone",
    "webhook_attempts",
    "collector_tasks",
    "tracker_limiter",
    "tracker_users",
    "tracker_videos",
    "tracker_ingest",
    "tracker_snapshots",
    "tracker_labels",
    "tracker_songs",
    "tracker_eta",
    "tracker_schedules",
    "crawl_jobs",
    "crawl_frontier",
    "crawl_robots_blocked",
    "crawl_idempotency",
    "cluster_requests",
    "llm_cache",
    "extract_jobs",
    "extract_pages",
    "crawl_cache",
    "crawl_snapshots",
    "agent_jobs",
    "agent_pages",
    "agent_steps",
    "monitors",
    "monitor_checks",
    "monitor_pages",
    "monitor_snapshots",
    "monitor_notifications",
    "feedback",
)
"""Every copied table, parents before children (foreign keys hold at each insert)."""

RUNTIME = {"cluster_members", "cluster_leases"}
"""Tables of running processes only (who is a member, who holds what): not copied; a copy runs
with no crawld on either end."""

DERIVED = {
    "tracker_latest": "SELECT count(*) FROM tracker_latest",
    "tracker_schedule_counts": "SELECT count(*) FROM tracker_schedule_counts WHERE n > 0",
    "tracker_windows": "SELECT count(*) FROM tracker_windows WHERE pending > 0",
}
"""Tables the triggers keep, with the count that must agree after the copy."""

SEEDED = {"tracker_settings"}
"""Tables the migrations seed with their one row: the copy overwrites it."""

CHUNK = 1000


class CopyRefused(Exception):
    """The copy cannot start or did not verify (the message says why); nothing was written."""


@dataclass(frozen=True)
class TableCount:
    table: str
    source: int
    target: int


def kind_of(declared: str) -> str:
    """int, real, text or blob from a column's declared type (SQLite's affinity rules, which
    also read PostgreSQL's type names right)."""
    t = declared.lower()
    if "int" in t:
        return "int"
    if any(word in t for word in ("char", "clob", "text")):
        return "text"
    if "blob" in t or "bytea" in t or not t:
        return "blob"
    if any(word in t for word in ("real", "floa", "doub", "numeric")):
        return "real"
    return "text"


def coerce(value: Any, kind: str) -> Any:
    """`value` as a column of `kind` takes it (SQLite stores what it is given)."""
    if value is None:
        return None
    if kind == "text" and isinstance(value, (bytes, memoryview)):
        return bytes(value).decode("utf-8")
    if kind == "blob" and isinstance(value, str):
        return value.encode("utf-8")
    if kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind == "real" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def plan(
    source: dict[str, list[tuple[str, str]]], target: dict[str, list[tuple[str, str]]]
) -> dict[str, list[tuple[str, str]]]:
    """{table: [(column, target kind)]} to copy, in COPY_ORDER; CopyRefused when the two
    schemas do not hold the same tables and columns (different crawld versions)."""
    known = set(COPY_ORDER) | set(DERIVED) | RUNTIME
    for side, tables in (("source", source), ("target", target)):
        unknown = sorted(set(tables) - known)
        missing = sorted(known - set(tables))
        if unknown or missing:
            raise CopyRefused(
                f"the {side} store's tables differ from this crawld's"
                f" (unknown: {unknown or 'none'}, missing: {missing or 'none'});"
                " run the same crawld version on both"
            )
    out: dict[str, list[tuple[str, str]]] = {}
    for table in COPY_ORDER:
        src_cols = [c for c, _ in source[table]]
        dst = dict(target[table])
        if sorted(src_cols) != sorted(dst):
            raise CopyRefused(f"table {table}: the columns differ between source and target")
        out[table] = [(c, kind_of(dst[c])) for c in src_cols]
    return out


def _count(conn: Any, sql: str) -> int:
    row = conn.execute(sql).fetchone()
    return int(row[0])


def copy_store(
    source: Backend, target: Backend, progress: Callable[[str, int], None] | None = None
) -> list[TableCount]:
    """Copy every row of `source` into the empty `target`; return the verified counts."""
    with contextlib.ExitStack() as held:
        for backend in (source, target):
            held.enter_context(backend.hold())
        src = source.connect()
        held.callback(_close, src)
        dst = target.connect()
        held.callback(_close, dst)
        source.migrate(src)
        target.migrate(dst)
        tables = plan(source.columns(src), target.columns(dst))
        busy = [t for t in (*COPY_ORDER, *DERIVED) if t not in SEEDED and _has_rows(dst, t)]
        if busy:
            raise CopyRefused(f"the target store is not empty (rows in {', '.join(busy)})")
        run = target.control(dst)
        run("BEGIN")
        try:
            for table, columns in tables.items():
                copied = _copy_table(src, dst, table, columns)
                if progress is not None:
                    progress(table, copied)
            target.after_copy(dst)
            counts = _verify(src, dst)
        except BaseException:
            run("ROLLBACK")
            raise
        run("COMMIT")
        return counts


def _close(conn: Any) -> None:
    raw = getattr(conn, "raw", conn)
    raw.close()


def _has_rows(conn: Any, table: str) -> bool:
    return conn.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() is not None


def _copy_table(src: Any, dst: Any, table: str, columns: list[tuple[str, str]]) -> int:
    names = ", ".join(c for c, _ in columns)
    kinds = [k for _, k in columns]
    if table in SEEDED:
        dst.execute(f"DELETE FROM {table}")
    insert = f"INSERT INTO {table}({names}) VALUES ({', '.join('?' for _ in columns)})"
    copied = 0
    for chunk in _chunks(src.execute(f"SELECT {names} FROM {table}"), CHUNK):
        dst.executemany(insert, [tuple(map(coerce, row, kinds)) for row in chunk])
        copied += len(chunk)
    return copied


def _chunks(rows: Iterable[Any], size: int) -> Iterable[list[Any]]:
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _verify(src: Any, dst: Any) -> list[TableCount]:
    counts = []
    queries = {t: f"SELECT count(*) FROM {t}" for t in COPY_ORDER} | DERIVED
    for table, sql in queries.items():
        count = TableCount(table, _count(src, sql), _count(dst, sql))
        if count.source != count.target:
            raise CopyRefused(
                f"verification failed: {table} has {count.source} rows in the source and"
                f" {count.target} in the target; nothing was kept"
            )
        counts.append(count)
    return counts
