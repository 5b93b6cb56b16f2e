from __future__ import annotations

import pytest

from daemon.store.dialect import UntranslatableSql, bulk_rows, to_postgres


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
    ("sql", "bulk"),
    [
        ("INSERT INTO job_rows(job_id, n, body) VALUES (?, ?, ?)",
         "INSERT INTO job_rows (job_id, n, body) VALUES "),
        ("INSERT INTO t(a, b) VALUES (?, ?) ON CONFLICT DO NOTHING", None),
        ("INSERT INTO t(a, b) VALUES (?, 'x')", None),
        ("INSERT INTO t(a, b) VALUES (?, ?) RETURNING a", None),
        ("INSERT INTO t VALUES (?, ?)", None),
    ],
)  # fmt: skip
def test_plain_inserts_go_as_one_many_row_insert(sql: str, bulk: str | None) -> None:
    assert to_postgres(sql).bulk == bulk


def test_bulk_rows_number_every_parameter_once() -> None:
    assert bulk_rows(2, 3) == "($1, $2), ($3, $4), ($5, $6)"
    assert bulk_rows(1, 1) == "($1)"


@pytest.mark.parametrize(
    ("shared", "postgres"),
    [
        ("SELECT 'a -- b', '/* c */' FROM t WHERE x = ?", "SELECT 'a -- b', '/* c */' FROM t WHERE x = $1"),
        ("SELECT 'x INDEXED BY y' FROM t INDEXED BY t_x", "SELECT 'x INDEXED BY y' FROM t"),
        ('SELECT "indexed" FROM t WHERE a = ?', 'SELECT "indexed" FROM t WHERE a = $1'),
        ("SELECT max (a, ?) FROM t", "SELECT GREATEST(a, $1) FROM t"),
        ("SELECT count (*) FROM t WHERE a IN (?, ?)", "SELECT count (*) FROM t WHERE a IN ($1, $2)"),
        ("INSERT INTO t (a) VALUES (?) ON CONFLICT (a) DO NOTHING",
         "INSERT INTO t (a) VALUES ($1) ON CONFLICT (a) DO NOTHING"),
        ("SELECT x FROM t WHERE EXISTS (SELECT 1) AND (a OR b)",
         "SELECT x FROM t WHERE EXISTS (SELECT 1) AND (a OR b)"),
        ("SELECT crawld_now_ms(), CAST(? AS INTEGER)", "SELECT crawld_now_ms(), CAST($1 AS INTEGER)"),
        ("SELECT x FROM (VALUES (1), (?)) v(x)", "SELECT x FROM (VALUES (1), ($1)) v(x)"),
        ("SELECT x FROM t AS v(x)", "SELECT x FROM t AS v(x)"),
        ("INSERT INTO t(a) VALUES (?)", "INSERT INTO t(a) VALUES ($1)"),
        ("INSERT INTO\n                t (a)\n        VALUES (?)", "INSERT INTO\n                t (a)\n        VALUES ($1)"),
    ],
)  # fmt: skip
def test_what_looks_risky_but_is_not(shared: str, postgres: str) -> None:
    assert to_postgres(shared).sql == postgres


@pytest.mark.parametrize(
    ("sql", "problem"),
    [
        ("SELECT a FROM t -- why ?\nWHERE b = ?", "a comment (--)"),
        ("SELECT a /* ? */ FROM t WHERE b = ?", "a comment (/*)"),
        ("SELECT a FROM t WHERE b = ?1 AND c = ?", "bare ? and numbered ?N placeholders are mixed"),
        ("SELECT a FROM t WHERE b = ? AND c = ?2", "bare ? and numbered ?N placeholders are mixed"),
        ("SELECT a FROM t NOT INDEXED WHERE b = ?", "INDEXED is only translated as the hint"),
        ('SELECT a FROM t INDEXED BY "t_b" WHERE b = ?', "INDEXED is only translated as the hint"),
        ("SELECT ifnull(a, 0) FROM t", "function ifnull() is not known"),
        ("SELECT group_concat(a) FROM t", "function group_concat() is not known"),
        ("SELECT a FROM t WHERE b = strftime('%s', 'now')", "function strftime() is not known"),
        ("SELECT IIF (a, 1, 2) FROM t", "function IIF() is not known"),
        ("SELECT a FROM t v(x)", "function v() is not known"),
        ("SELECT a FROM tinto(x)", "function tinto() is not known"),
    ],
)  # fmt: skip
def test_what_cannot_be_translated_safely_is_refused(sql: str, problem: str) -> None:
    with pytest.raises(UntranslatableSql) as refused:
        to_postgres(sql)
    assert problem in str(refused.value)
    assert str(refused.value).endswith(sql)
    with pytest.raises(UntranslatableSql):  # not cached as translated
        to_postgres(sql)


def test_a_schema_change_names_tables_not_functions() -> None:
    sql = "CREATE TABLE t(x BIGINT, y VARCHAR(10), UNIQUE (x))"
    assert to_postgres(sql).sql == sql
