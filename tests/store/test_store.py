from __future__ import annotations

from pathlib import Path

import apsw
import pytest
import trio

from daemon.store import migrate, migrations, open_store


async def test_opens_in_wal_with_settings(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db", synchronous="full", busy_timeout=7) as store:
        mode, sync, fk = await store.read(
            lambda c: (
                c.execute("pragma journal_mode").fetchone()[0],
                c.execute("pragma synchronous").fetchone()[0],
                c.execute("pragma foreign_keys").fetchone()[0],
            )
        )
    assert (mode, sync, fk) == ("wal", 2, 1)


async def test_migrations_apply_once_and_record_version(tmp_path: Path) -> None:
    latest = migrations()[-1][0]
    async with open_store(tmp_path / "db") as store:
        assert store.schema_version == latest
    conn = apsw.Connection(str(tmp_path / "db"))
    assert conn.execute("pragma user_version").fetchone()[0] == latest
    assert migrate(conn) == latest  # idempotent
    conn.close()


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "db"))
    conn.execute("pragma user_version=9999")
    conn.close()
    with pytest.raises(RuntimeError, match="newer than this crawld"):
        async with open_store(tmp_path / "db"):
            pass


async def test_group_commit_merges_concurrent_writes(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x INTEGER)"))
        before = store.stats.transactions

        async def writer(i: int) -> None:
            await store.write(lambda c: c.execute("INSERT INTO t VALUES (?)", (i,)))

        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(writer, i)
        count = await store.read(lambda c: c.execute("SELECT count(*) FROM t").fetchone()[0])
        assert count == 200
        assert store.stats.transactions - before < 200
        assert store.stats.largest_group > 1


async def test_failing_job_rolls_back_only_itself(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x INTEGER UNIQUE)"))
        results: list[str] = []

        async def insert(x: int) -> None:
            try:
                await store.write(lambda c: c.execute("INSERT INTO t VALUES (?)", (x,)))
                results.append(f"ok {x}")
            except apsw.ConstraintError:
                results.append(f"dup {x}")

        async with trio.open_nursery() as nursery:
            for x in (1, 2, 1, 3):
                nursery.start_soon(insert, x)
        rows = await store.read(lambda c: c.execute("SELECT x FROM t ORDER BY x").fetchall())
        assert rows == [(1,), (2,), (3,)]
        assert sorted(results) == ["dup 1", "ok 1", "ok 2", "ok 3"]


async def test_exception_in_write_reaches_caller(tmp_path: Path) -> None:
    def boom(conn: apsw.Connection) -> None:
        conn.execute("CREATE TABLE t(x)")
        raise ValueError("boom")

    async with open_store(tmp_path / "db") as store:
        with pytest.raises(ValueError, match="boom"):
            await store.write(boom)
        tables = await store.read(
            lambda c: c.execute("SELECT name FROM sqlite_master WHERE name='t'").fetchall()
        )
        assert tables == []


async def test_disk_full_fails_only_the_job_that_hit_it(tmp_path: Path) -> None:
    """SQLITE_FULL abandons the whole transaction: the other jobs of the group must neither be
    reported failed when they were stored, nor be stored when reported failed."""
    async with open_store(tmp_path / "db", group_commit_max=64) as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(name TEXT, pad BLOB)"))
        pages = await store.read(lambda c: c.execute("pragma page_count").fetchone()[0])
        await store.write(lambda c: c.execute(f"pragma max_page_count={pages + 2}"))
        outcome: dict[str, str] = {}

        async def insert(name: str, size: int) -> None:
            try:
                await store.write(
                    lambda c: c.execute("INSERT INTO t VALUES (?, zeroblob(?))", (name, size))
                )
                outcome[name] = "ok"
            except apsw.FullError:
                outcome[name] = "full"

        async with trio.open_nursery() as nursery:
            for name, size in (("a", 10), ("big", 1_000_000), ("c", 10), ("d", 10)):
                nursery.start_soon(insert, name, size)
        stored = await store.read(lambda c: [r[0] for r in c.execute("SELECT name FROM t")])
    assert outcome["big"] == "full"
    assert sorted(n for n, o in outcome.items() if o == "ok") == sorted(stored)
    assert sorted(stored) == ["a", "c", "d"]
