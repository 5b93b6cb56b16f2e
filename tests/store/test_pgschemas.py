"""The tests' pool of migrated PostgreSQL schemas (tests/pgschemas.py): a schema comes back as
the migrations left it, and one a test changed the structure of, or that a crawld connection
still uses, is not handed out again."""

from __future__ import annotations

import psycopg
import pytest

from daemon.store.postgres import connect
from tests.conftest import require_pg
from tests.pgschemas import SchemaPool

pytestmark = pytest.mark.postgres


def rows(dsn: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def test_a_schema_comes_back_as_the_migrations_left_it() -> None:
    pool = SchemaPool(require_pg())
    try:
        schema = pool.take()
        seeds = rows(pool.dsn, f"SELECT * FROM {schema}.tracker_settings")
        with psycopg.connect(pool.dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE {schema}.tracker_settings SET window_ms = 1")
            conn.execute(
                f"INSERT INTO {schema}.jobs (id, kind, status, created_ms, expires_ms, source)"
                " VALUES ('j1', 'crawl', 'scraping', 1, 1, '{{}}')"
            )
            conn.execute(
                f"INSERT INTO {schema}.tracker_schedules (aid, type, planned_ms, created_ms)"
                " VALUES (1, 'normal', 1, 1)"
            )
        pool.give_back(schema)
        assert pool.take() == schema  # reused, emptied
        assert rows(pool.dsn, f"SELECT * FROM {schema}.tracker_settings") == seeds
        assert rows(pool.dsn, f"SELECT count(*) FROM {schema}.jobs") == [(0,)]
        assert rows(pool.dsn, f"SELECT count(*) FROM {schema}.tracker_schedule_counts "
                              "WHERE n <> 0") == [(0,)]  # fmt: skip
        with psycopg.connect(pool.dsn, autocommit=True) as conn:
            first = conn.execute(
                f"INSERT INTO {schema}.tracker_schedules (aid, type, planned_ms, created_ms)"
                " VALUES (1, 'normal', 1, 1) RETURNING id"
            ).fetchone()
        assert first == (1,)  # its sequence starts again
        pool.give_back(schema)
    finally:
        pool.close()
    assert rows(pool.dsn, f"SELECT count(*) FROM pg_namespace WHERE nspname = '{schema}'") == [(0,)]


def test_a_changed_or_busy_schema_is_dropped_not_reused() -> None:
    pool = SchemaPool(require_pg(), passes=2)
    try:
        changed = pool.take()
        with psycopg.connect(pool.dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {changed}.jobs ADD COLUMN extra TEXT")
        pool.give_back(changed)
        busy = pool.take()
        assert busy != changed
        held = connect(pool.dsn, busy)  # a crawld connection that did not end
        try:
            pool.give_back(busy)
            assert pool.take() not in (busy, changed)  # in use: not handed out
            assert pool.take() not in (busy, changed)  # and dropped after `passes` takes
            assert busy not in pool.given_back
        finally:
            held.close()
        gone = rows(
            pool.dsn,
            f"SELECT count(*) FROM pg_namespace WHERE nspname IN ('{changed}', '{busy}')",
        )
        assert gone == [(0,)]
    finally:
        pool.close()
