# The LLM answer cache's statements (table llm_cache, migration 0013), written once for both
# backends. A hit is a row whose key matches and whose expiry is still ahead.
from __future__ import annotations

from typing import Any

from daemon.store import Conn

PURGE_BATCH = 1000


def cached(conn: Conn, key: str, now_ms: int) -> tuple[str, int, int] | None:
    """(value JSON, prompt tokens, completion tokens) of a live entry, or None."""
    row = conn.execute(
        "SELECT value, prompt_tokens, completion_tokens FROM llm_cache"
        " WHERE key = ? AND expires_ms > ?",
        (key, now_ms),
    ).fetchone()
    return None if row is None else (str(row[0]), int(row[1]), int(row[2]))


def remember(
    conn: Conn,
    key: str,
    kind: str,
    model: str,
    value: str,
    usage: tuple[int, int],
    now_ms: int,
    ttl_ms: int,
) -> None:
    conn.execute(
        "INSERT INTO llm_cache (key, kind, model, value, prompt_tokens, completion_tokens,"
        " created_ms, expires_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(key) DO UPDATE SET"
        " value = excluded.value, prompt_tokens = excluded.prompt_tokens,"
        " completion_tokens = excluded.completion_tokens, created_ms = excluded.created_ms,"
        " expires_ms = excluded.expires_ms",
        (key, kind, model, value, usage[0], usage[1], now_ms, now_ms + ttl_ms),
    )


def purge(conn: Conn, now_ms: int) -> int:
    """Delete up to PURGE_BATCH expired entries; how many went."""
    rows: list[Any] = conn.execute(
        "SELECT key FROM llm_cache WHERE expires_ms <= ? ORDER BY expires_ms LIMIT ?",
        (now_ms, PURGE_BATCH),
    ).fetchall()
    if rows:
        conn.executemany("DELETE FROM llm_cache WHERE key = ?", [(r[0],) for r in rows])
    return len(rows)


def entries(conn: Conn) -> int:
    return int(conn.execute("SELECT count(*) FROM llm_cache").fetchone()[0])
