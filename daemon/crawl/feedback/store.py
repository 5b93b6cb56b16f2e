# The feedback table (migration 0018) as plain functions over a store connection, one SQL text for
# both backends; a feedback is one row written in one transaction, so it is stored whole or not.
from __future__ import annotations

from typing import Any

import msgspec

from daemon.store import Conn


class FeedbackRow(msgspec.Struct, frozen=True):
    id: str
    endpoint: str
    target_id: str | None
    rating: str
    body: bytes
    created_ms: int


def insert(conn: Conn, row: FeedbackRow) -> None:
    conn.execute(
        "INSERT INTO feedback(id, endpoint, target_id, rating, body, created_ms)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (row.id, row.endpoint, row.target_id, row.rating, row.body, row.created_ms),
    )


def listing(conn: Conn, limit: int, offset: int) -> list[FeedbackRow]:
    rows: list[Any] = conn.execute(
        "SELECT id, endpoint, target_id, rating, body, created_ms FROM feedback"
        " ORDER BY created_ms DESC, id LIMIT ? OFFSET ?",
        (limit, offset),
    ).fetchall()
    return [FeedbackRow(r[0], r[1], r[2], r[3], bytes(r[4]), r[5]) for r in rows]


def count(conn: Conn) -> int:
    row = conn.execute("SELECT COUNT(*) FROM feedback").fetchone()
    return int(row[0]) if row else 0


def exists_for(conn: Conn, endpoint: str, target_id: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM feedback WHERE endpoint = ? AND target_id = ? LIMIT 1", (endpoint, target_id)
    ).fetchone()
    return row is not None
