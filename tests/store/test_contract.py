"""The store contract, on both backends: what every area relies on, whichever database holds it."""

from __future__ import annotations

from typing import Any

import apsw
import psycopg.errors
import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from daemon.store import DB_ERRORS, Store, StoreClosed, one, open_store

UNIQUE_VIOLATION = (apsw.ConstraintError, psycopg.errors.UniqueViolation)


async def test_group_commit_merges_concurrent_writes(store: Store) -> None:
    await store.write(lambda c: c.execute("CREATE TABLE t(x BIGINT)"))
    before = store.stats.transactions

    async def writer(i: int) -> None:
        await store.write(lambda c: c.execute("INSERT INTO t VALUES (?)", (i,)))

    async with trio.open_nursery() as nursery:
        for i in range(200):
            nursery.start_soon(writer, i)
    assert await store.read(lambda c: one(c, "SELECT count(*), sum(x) FROM t")) == (200, 19900)
    assert store.stats.transactions - before < 200
    assert store.stats.largest_group > 1


async def test_a_constraint_violation_fails_its_caller_not_the_store(store: Store) -> None:
    await store.write(lambda c: c.execute("CREATE TABLE t(x BIGINT UNIQUE)"))
    results: list[str] = []

    async def insert(x: int) -> None:
        try:
            await store.write(lambda c: c.execute("INSERT INTO t VALUES (?)", (x,)))
            results.append(f"ok {x}")
        except UNIQUE_VIOLATION:
            results.append(f"dup {x}")

    for _ in range(2):  # the second round runs on the connection the first left behind
        async with trio.open_nursery() as nursery:
            for x in (1, 2, 1, 3):
                nursery.start_soon(insert, x)
    rows = await store.read(lambda c: c.execute("SELECT x FROM t ORDER BY x").fetchall())
    assert rows == [(1,), (2,), (3,)]
    assert sorted(results) == ["dup 1"] * 3 + ["dup 2", "dup 3", "ok 1", "ok 2", "ok 3"]
    assert store.health().writable


async def test_an_exception_reaches_the_caller_and_stores_nothing(store: Store) -> None:
    await store.write(lambda c: c.execute("CREATE TABLE t(x BIGINT)"))

    def boom(conn: Any) -> None:
        conn.execute("INSERT INTO t VALUES (1)")
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await store.write(boom)
    assert await store.read(lambda c: one(c, "SELECT count(*) FROM t")[0]) == 0


async def test_executemany_returns_every_row_in_order_and_changes_counts(store: Store) -> None:
    await store.write(lambda c: c.execute("CREATE TABLE t(id BIGINT PRIMARY KEY, n BIGINT)"))
    await store.write(
        lambda c: c.executemany("INSERT INTO t VALUES (?, ?)", [(i, 0) for i in range(1, 6)])
    )

    def bump(conn: Any) -> tuple[list[Any], int]:
        rows = conn.executemany(
            "UPDATE t SET n = n + ? WHERE id = ? RETURNING id, n", [(10, 3), (20, 1), (1, 99)]
        )
        got = list(rows)
        conn.execute("UPDATE t SET n = max(n, ?) WHERE id > ?", (15, 2))
        return got, conn.changes()

    got, changed = await store.write(bump)
    assert got == [(3, 10), (1, 20)]
    assert changed == 3
    rows = await store.read(lambda c: c.execute("SELECT id, n FROM t ORDER BY id").fetchall())
    assert rows == [(1, 20), (2, 0), (3, 15), (4, 15), (5, 15)]


async def test_numbered_parameters_and_shared_upserts(store: Store) -> None:
    await store.write(lambda c: c.execute("CREATE TABLE t(k TEXT PRIMARY KEY, v BIGINT, b BYTEA)"))

    def upsert(conn: Any, k: str, v: int) -> None:
        conn.execute(
            "INSERT INTO t(k, v, b) VALUES (?, ?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
            (k, v, b"\x00raw"),
        )

    await store.write(lambda c: upsert(c, "a", 1))
    await store.write(lambda c: upsert(c, "a", 2))
    await store.write(
        lambda c: c.execute("INSERT INTO t(k, v, b) VALUES ('a', 3, NULL) ON CONFLICT DO NOTHING")
    )
    row = await store.read(
        lambda c: one(c, "SELECT ?1, v, b, v + ?1 FROM t WHERE k = ?2", (5, "a"))
    )
    assert row == (5, 2, b"\x00raw", 7)


async def test_read_sees_one_snapshot_while_the_writer_works(store: Store) -> None:
    await store.write(lambda c: c.execute("CREATE TABLE t(x BIGINT)"))
    await store.write(lambda c: c.execute("INSERT INTO t VALUES (1)"))
    first = trio.Event()
    written = trio.Event()

    def read(conn: Any) -> tuple[int, int]:
        a = one(conn, "SELECT count(*) FROM t")[0]
        trio.from_thread.run_sync(first.set)
        trio.from_thread.run(written.wait)
        return a, one(conn, "SELECT count(*) FROM t")[0]

    async with trio.open_nursery() as nursery:
        got: list[tuple[int, int]] = []

        async def reader() -> None:
            got.append(await store.read(read))

        nursery.start_soon(reader)
        await first.wait()
        await store.write(lambda c: c.execute("INSERT INTO t VALUES (2)"))
        written.set()
    assert got == [(1, 1)]
    assert await store.read(lambda c: one(c, "SELECT count(*) FROM t")[0]) == 2


async def test_a_cancelled_caller_does_not_undo_a_handed_over_write(store: Store) -> None:
    await store.write(lambda c: c.execute("CREATE TABLE t(x BIGINT)"))
    with trio.move_on_after(0) as scope:
        await store.write(lambda c: c.execute("INSERT INTO t VALUES (1)"))
    assert scope.cancelled_caught
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.write, lambda c: c.execute("INSERT INTO t VALUES (2)"))
        await wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    for _ in range(3):
        await store.write(lambda c: None)
    assert await store.read(lambda c: one(c, "SELECT count(*) FROM t")[0]) in (1, 2)


async def test_writes_after_close_are_refused_naming_the_backend(
    store_target: Any,
) -> None:
    async with open_store(store_target) as opened:
        pass
    with pytest.raises(StoreClosed, match=opened.backend.name):
        await opened.write(lambda c: None)
    with pytest.raises(StoreClosed, match=opened.backend.name):
        await opened.read(lambda c: None)


async def test_db_errors_cover_a_bad_statement(store: Store) -> None:
    with pytest.raises(DB_ERRORS):
        await store.write(lambda c: c.execute("SELECT * FROM no_such_table"))
    with pytest.raises(DB_ERRORS):
        await store.read(lambda c: c.execute("SELECT * FROM no_such_table").fetchall())
    assert await store.write(lambda c: one(c, "SELECT 41 + 1")[0]) == 42
