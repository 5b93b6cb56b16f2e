from __future__ import annotations

import pytest

from daemon.store.dialect import to_postgres


@pytest.mark.parametrize(
    ("shared", "postgres"),
    [
        ("SELECT x FROM t WHERE a = ? AND b = ?", "SELECT x FROM t WHERE a = $1 AND b = $2"),
        (
            "SELECT ?1 FROM t WHERE aid = ?1 AND at > ?2",
            "SELECT $1 FROM t WHERE aid = $1 AND at > $2",
        ),
        (
            "UPDATE s SET c = max(c, ?) WHERE s = ?",
            "UPDATE s SET c = GREATEST(c, $1) WHERE s = $2",
        ),
        (
            "UPDATE j SET total = max(total, done + ?, ?) WHERE id = ?",
            "UPDATE j SET total = GREATEST(total, done + $1, $2) WHERE id = $3",
        ),
        (
            "SELECT min(a, coalesce(max(b), 0)) FROM t",
            "SELECT LEAST(a, coalesce(max(b), 0)) FROM t",
        ),
        ("SELECT max(n), min(n) FROM t", "SELECT max(n), min(n) FROM t"),
        ("SELECT id FROM t INDEXED BY t_due WHERE x = ?", "SELECT id FROM t WHERE x = $1"),
        (
            "SELECT 'a?b', \"max\"(x, y) FROM t WHERE c = ?",
            "SELECT 'a?b', \"max\"(x, y) FROM t WHERE c = $1",
        ),
        ("SELECT 'it''s ?' WHERE x = ?", "SELECT 'it''s ?' WHERE x = $1"),
        ("SELECT t.max(a, b)", "SELECT t.max(a, b)"),
    ],
)
def test_shared_sql_becomes_postgres(shared: str, postgres: str) -> None:
    assert to_postgres(shared).sql == postgres


@pytest.mark.parametrize(
    ("sql", "rows"),
    [
        ("SELECT 1", True),
        ("  with x as (select 1) select * from x", True),
        ("UPDATE t SET a = 1 WHERE b = ? RETURNING a", True),
        ("UPDATE t SET a = 1", False),
        ("INSERT INTO t VALUES (?)", False),
        ("DELETE FROM t WHERE x = ? RETURNING x", True),
    ],
)
def test_which_statements_return_rows(sql: str, rows: bool) -> None:
    assert to_postgres(sql).returns_rows is rows


@pytest.mark.parametrize(
    ("sql", "copy"),
    [
        ("INSERT INTO job_rows(job_id, n, body) VALUES (?, ?, ?)",
         "COPY job_rows (job_id, n, body) FROM STDIN"),
        ("INSERT INTO t(a, b) VALUES (?, ?) ON CONFLICT DO NOTHING", None),
        ("INSERT INTO t(a, b) VALUES (?, 'x')", None),
        ("INSERT INTO t(a, b) VALUES (?, ?) RETURNING a", None),
        ("INSERT INTO t VALUES (?, ?)", None),
    ],
)  # fmt: skip
def test_plain_inserts_can_be_copied(sql: str, copy: str | None) -> None:
    assert to_postgres(sql).copy == copy
