"""`crawld store copy`: a stopped SQLite deployment moves into an empty PostgreSQL schema (and
back) with every row, derived tables rebuilt by the target's triggers, counts verified; a
non-empty target or a running source is refused and changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from daemon.store import Store, hold_state_dir, one, open_store
from daemon.store.copy import COPY_ORDER, DERIVED, CopyRefused, coerce, copy_store, kind_of
from daemon.store.errors import StoreUnavailable
from daemon.store.sqlite import SqliteBackend
from tests.conftest import pg_backend

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]


def fill(conn: Any) -> None:
    """A row or more in every table, as the areas write them (an old file's JSON bytes in a
    TEXT column included)."""
    conn.execute("UPDATE tracker_settings SET window_ms = 60000")
    conn.execute("INSERT INTO outbox_streams VALUES ('queue:job_data', 3, 1)")
    conn.execute(
        "INSERT INTO jobs(id, kind, status, completed, total, created_ms, expires_ms, webhook,"
        " source, last_seq) VALUES ('j1', 'collector', 'scraping', 2, 3, 1, 99, NULL, ?, 2)",
        (b'{"task_id":"t"}',),
    )
    conn.executemany(
        "INSERT INTO job_rows VALUES ('j1', ?, ?)", [(n, b'{"n":%d}' % n) for n in (1, 2, 3)]
    )
    conn.execute("INSERT INTO job_errors VALUES ('j1', 1, 'e1', 5, 'http://x/', 'E', 'bad')")
    conn.executemany(
        "INSERT INTO outbox_items(stream, seq, key, body, meta, created_ms, expires_ms, row_job,"
        " row_n) VALUES ('queue:job_data', ?, ?, X'', X'7B7D', 1, NULL, 'j1', ?)",
        [(n, f"k{n}", n) for n in (2, 3)],
    )
    conn.execute("INSERT INTO webhook_gone VALUES ('j1', 'j1:1', 'crawl.page', 'e1', 0, 3)")
    conn.execute("INSERT INTO webhook_attempts VALUES ('j1', 2, 3, 9000, 503, 'HTTP 503', 8000)")
    conn.execute("INSERT INTO collector_tasks(task, progress, updated_ms) VALUES ('t', ?, 4)",
                 (b"\x01\x02",))  # fmt: skip
    conn.execute("INSERT INTO tracker_limiter VALUES ('direct', 'bulk', 123)")
    conn.execute("INSERT INTO tracker_users VALUES (7, 'u', 's', 3, 'f', 1)")
    conn.execute(
        "INSERT INTO tracker_videos(aid, title, tags, uid, status, added_ms)"
        " VALUES (1, '歌', ?, 7, 0, 1), (2, 'b', '[]', NULL, -404, 1)",
        (b'["vocaloid"]',),
    )
    conn.execute("INSERT INTO tracker_ingest VALUES (3, 1, 2, 0, 'discovery', NULL)")
    conn.executemany(
        "INSERT INTO tracker_snapshots VALUES (1, ?, ?, 0, 0, 0, 0, 0, 0)",
        [(at, at * 10) for at in (1000, 3000, 2000)],
    )
    conn.execute("INSERT INTO tracker_labels VALUES (1, 'm1', 1, '[0.1, 0.9]', 1)")
    conn.execute("INSERT INTO tracker_songs VALUES (1, 1, 1)")
    conn.execute("INSERT INTO tracker_eta VALUES (1, 12.5, 3.25, 30000, 1)")
    conn.executemany(
        "INSERT INTO tracker_schedules(aid, type, status, planned_ms, created_ms)"
        " VALUES (1, ?, ?, ?, 1)",
        [("normal", "pending", 70000), ("new", "completed", 10), ("archive", "pending", 130000)],
    )
    conn.execute("INSERT INTO jobs(id, kind, status, created_ms, expires_ms, source)"
                 " VALUES ('c1', 'crawl', 'scraping', 1, 9, X'7B7D')")  # fmt: skip
    conn.execute(
        "INSERT INTO crawl_jobs VALUES ('c1', 'crawl', 'http://a/', X'7B7D', 1, 2, NULL, NULL)"
    )
    conn.executemany(
        "INSERT INTO crawl_frontier VALUES ('c1', ?, ?, ?, 0, ?, ?)",
        [(1, "a/", "http://a/", "done", None), (2, "a/b", "http://a/b", "queued", "a/1f")],
    )
    conn.execute("INSERT INTO crawl_robots_blocked VALUES ('c1', 'http://a/private')")
    conn.execute("INSERT INTO crawl_idempotency VALUES ('key', 'c1', 1)")
    conn.execute("INSERT INTO cluster_requests(lease, action, body, from_instance, created_ms)"
                 " VALUES ('collector:t', 'start', '{}', 'a', 1)")  # fmt: skip
    conn.execute("INSERT INTO llm_cache VALUES ('k', 'json', 'm', '{\"a\": 1}', 10, 2, 1, 99)")
    conn.execute("INSERT INTO jobs(id, kind, status, created_ms, expires_ms, source)"
                 " VALUES ('x1', 'extract', 'scraping', 1, 9, X'7B7D')")  # fmt: skip
    conn.execute("INSERT INTO extract_jobs(job_id, plan) VALUES ('x1', X'7B7D')")
    conn.execute(
        "INSERT INTO extract_pages VALUES ('x1', 0, 'a/', 'http://a/', 0, 0, 'done', X'7B7D', 5,"
        " NULL)"
    )
    conn.execute("INSERT INTO crawl_cache VALUES ('h', 'http://a/', 5, 2, '{}')")
    conn.execute("INSERT INTO crawl_snapshots VALUES ('http://a/', '', 5, '# A')")
    conn.execute("INSERT INTO jobs(id, kind, status, created_ms, expires_ms, source)"
                 " VALUES ('g1', 'agent', 'scraping', 1, 9, X'7B7D')")  # fmt: skip
    conn.execute("INSERT INTO agent_jobs(job_id, plan) VALUES ('g1', X'7B7D')")
    conn.execute(
        "INSERT INTO agent_pages VALUES ('g1', 1, 'a/', 'http://a/', 'request', -1, 'A', '',"
        " 'read', '# A', NULL)"
    )
    conn.execute(
        "INSERT INTO agent_steps VALUES ('g1', 1, 'scrape', X'7B7D', X'7B7D', 1, 0, 0, 1, 5, 3)"
    )
    conn.execute("INSERT INTO monitors(id, name, status, spec, created_ms, updated_ms)"
                 " VALUES ('m1', 'm', 'active', X'7B7D', 1, 1)")  # fmt: skip
    conn.execute("INSERT INTO monitor_checks(id, monitor_id, status, trigger_kind, spec,"
                 " created_ms, updated_ms) VALUES ('k1', 'm1', 'completed', 'manual', X'7B7D',"
                 " 1, 1)")  # fmt: skip
    conn.execute("INSERT INTO monitor_pages(check_id, n, target_id, key, url, state, created_ms)"
                 " VALUES ('k1', 1, 't', 'a/', 'http://a/', 'done', 1)")  # fmt: skip
    conn.execute("INSERT INTO monitor_snapshots VALUES ('m1', 't', 'a/', 'http://a/', 's', '# A',"
                 " 0, 1)")  # fmt: skip
    conn.execute("INSERT INTO monitor_notifications VALUES ('k1', 'email', 'm1', 'sent', 1, 1,"
                 " X'7B7D', NULL, 1, 1)")  # fmt: skip
    conn.execute("INSERT INTO feedback VALUES ('f1', 'search', 's1', 'good', X'7B7D', 1)")


def counts(conn: Any) -> dict[str, int]:
    queries = {t: f"SELECT count(*) FROM {t}" for t in COPY_ORDER} | DERIVED
    return {t: one(conn, sql)[0] for t, sql in queries.items()}


async def filled_sqlite(state: Path) -> dict[str, int]:
    async with open_store(state / "crawld.db") as store:
        await store.write(fill)
        return await store.read(counts)


async def test_sqlite_to_postgres_and_back_keeps_every_row(
    tmp_path: Path, pg_schema: tuple[str, str]
) -> None:
    before = await filled_sqlite(tmp_path / "a")
    assert all(before[t] > 0 for t in (*COPY_ORDER, *DERIVED)), before
    pg = pg_backend(*pg_schema)
    copied = copy_store(SqliteBackend(tmp_path / "a" / "crawld.db"), pg)
    assert {c.table: c.target for c in copied} == before

    async with open_store(pg_backend(*pg_schema)) as store:
        assert await store.read(counts) == before
        latest = await store.read(lambda c: one(c, "SELECT at_ms, views FROM tracker_latest"))
        assert latest == (3000, 30000)  # rebuilt by the trigger from the copied snapshots
        tags = await store.read(lambda c: one(c, "SELECT tags FROM tracker_videos WHERE aid = 1"))
        assert tags == ('["vocaloid"]',)
        body = await store.read(lambda c: one(c, "SELECT body FROM job_rows WHERE n = 3"))
        assert body == (b'{"n":3}',)
        # new rows get ids after the copied ones
        new_id = await store.write(
            lambda c: one(
                c,
                "INSERT INTO tracker_schedules(aid, type, planned_ms, created_ms)"
                " VALUES (1, 'milestone', 5, 5) RETURNING id",
            )[0]
        )
        assert new_id == 4
        await store.write(lambda c: c.execute("DELETE FROM tracker_schedules WHERE id = 4"))

    back = tmp_path / "b" / "crawld.db"
    copy_store(pg_backend(*pg_schema), SqliteBackend(back))
    store = Store(back)
    store.backend.open_readers()
    try:
        assert await store.read(counts) == before
    finally:
        store.close()


async def test_a_non_empty_target_is_refused_and_keeps_its_rows(
    tmp_path: Path, pg_schema: tuple[str, str]
) -> None:
    before = await filled_sqlite(tmp_path / "a")
    copy_store(SqliteBackend(tmp_path / "a" / "crawld.db"), pg_backend(*pg_schema))
    with pytest.raises(CopyRefused, match="target store is not empty"):
        copy_store(SqliteBackend(tmp_path / "a" / "crawld.db"), pg_backend(*pg_schema))
    async with open_store(pg_backend(*pg_schema)) as store:
        assert await store.read(counts) == before


async def test_a_running_source_is_refused(tmp_path: Path, pg_schema: tuple[str, str]) -> None:
    await filled_sqlite(tmp_path / "a")
    with hold_state_dir(tmp_path / "a"), pytest.raises(StoreUnavailable, match="in use"):
        copy_store(SqliteBackend(tmp_path / "a" / "crawld.db"), pg_backend(*pg_schema))
    async with open_store(pg_backend(*pg_schema)) as store:
        assert await store.read(lambda c: one(c, "SELECT count(*) FROM jobs")[0]) == 0
    # a running PostgreSQL deployment: a crawld (a cluster member) holds the schema
    with (
        pg_backend(*pg_schema).hold("node-1"),
        pytest.raises(StoreUnavailable, match=r"in use by a running crawld \(server pid"),
    ):
        copy_store(pg_backend(*pg_schema), SqliteBackend(tmp_path / "c" / "crawld.db"))


async def test_the_command_exits_0_then_2_with_the_reason(
    tmp_path: Path, pg_schema: tuple[str, str]
) -> None:
    dsn, schema = pg_schema
    await filled_sqlite(tmp_path / "a")
    (tmp_path / "from.toml").write_text('[daemon]\nstate_dir = "a"\n')
    (tmp_path / "to.toml").write_text(
        f'[daemon]\nstate_dir = "b"\n[store]\nkind = "postgres"\ndsn_env = "TEST_COPY_DSN"\n'
        f'schema = "{schema}"\n'
    )
    env = {**os.environ, "TEST_COPY_DSN": dsn}
    env.pop("STATE_DIRECTORY", None)

    def run() -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "daemon", "store", "copy"]
        return subprocess.run(
            [*command, str(tmp_path / "from.toml"), str(tmp_path / "to.toml")],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    done = run()
    assert done.returncode == 0, done.stderr
    assert "every count verified" in done.stdout
    again = run()
    assert again.returncode == 2
    assert "target store is not empty" in again.stderr


@pytest.mark.parametrize(
    ("declared", "kind"),
    [("INTEGER", "int"), ("bigint", "int"), ("TEXT", "text"), ("text", "text"),
     ("BLOB", "blob"), ("bytea", "blob"), ("REAL", "real"), ("double precision", "real")],
)  # fmt: skip
def test_kind_of_reads_both_backends_types(declared: str, kind: str) -> None:
    assert kind_of(declared) == kind


def test_coerce_fits_values_to_the_target_column() -> None:
    assert coerce(b"[1]", "text") == "[1]"
    assert coerce("x", "blob") == b"x"
    assert coerce(3.0, "int") == 3 and coerce(3, "real") == 3.0
    assert coerce(None, "text") is None and coerce(True, "real") is True
