"""A write marked small (`store.write(fn, small=True)`, a webhook drainer's ack) commits on the
trio thread when nothing is queued and the backend commits quickly, and otherwise is an ordinary
write: same order, same result, same exception, same wake-ups."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from daemon.store import Store, StoreClosed, one, open_store, sqlite, wake


def thread_of(conn: Any) -> int:
    return threading.get_ident()


async def test_a_small_write_commits_on_the_trio_thread_when_nothing_is_queued(
    tmp_path: Path,
) -> None:
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x INTEGER)"))
        before = store.stats.transactions

        def insert(conn: Any) -> int:
            conn.execute("INSERT INTO t VALUES (1)")
            return threading.get_ident()

        assert await store.write(insert, small=True) == threading.get_ident()
        assert store.stats.transactions == before + 1
        assert await store.read(lambda c: one(c, "SELECT count(*) FROM t")[0]) == 1
        assert await store.write(thread_of) != threading.get_ident()  # not marked small


async def test_a_small_write_waits_behind_the_writes_queued_before_it(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x INTEGER)"))
        release = threading.Event()
        order: list[str] = []

        def slow(conn: Any) -> None:
            release.wait(10)
            conn.execute("INSERT INTO t VALUES (1)")
            order.append("queued")

        def small(conn: Any) -> int:
            conn.execute("INSERT INTO t VALUES (2)")
            order.append("small")
            return threading.get_ident()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.write, slow)
            await wait_all_tasks_blocked()
            result: list[int] = []

            async def write_small() -> None:
                result.append(await store.write(small, small=True))

            nursery.start_soon(write_small)
            await wait_all_tasks_blocked()
            release.set()
        assert order == ["queued", "small"]
        assert result != [threading.get_ident()]


async def test_small_writes_made_together_share_a_group_after_the_first(tmp_path: Path) -> None:
    """Only the first write of a scheduler pass commits on the trio thread: many drainers acking
    at once do not make as many commits there."""
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: None)
        for _ in range(2):  # the second round: after the first left its flusher woken
            before = store.stats.transactions
            threads: list[int] = []

            async def small(threads: list[int]) -> None:
                threads.append(await store.write(thread_of, small=True))

            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(small, threads)
            assert threads.count(threading.get_ident()) == 1
            assert store.stats.transactions - before == 2


async def test_a_small_write_that_fails_is_queued_and_its_exception_comes_back(
    tmp_path: Path,
) -> None:
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x INTEGER)"))
        threads: list[int] = []

        def boom(conn: Any) -> None:
            threads.append(threading.get_ident())
            conn.execute("INSERT INTO t VALUES (1)")
            raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            await store.write(boom, small=True)
        # Rolled back on the trio thread, run again (and rolled back) in the writer thread.
        assert threads[0] == threading.get_ident() != threads[1]
        assert await store.read(lambda c: one(c, "SELECT count(*) FROM t")[0]) == 0
        assert store.health().writable
        assert await store.write(thread_of, small=True) == threading.get_ident()


async def test_a_small_write_once_the_store_stops_is_refused(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x INTEGER)"))
        store.stop_writer()
        with pytest.raises(StoreClosed):
            await store.write(lambda c: c.execute("INSERT INTO t VALUES (1)"), small=True)
    with pytest.raises(StoreClosed):
        await store.write(lambda c: c.execute("INSERT INTO t VALUES (1)"), small=True)
    conn = apsw.Connection(str(tmp_path / "db"))
    assert one(conn, "SELECT count(*) FROM t")[0] == 0
    conn.close()


async def test_with_a_fsync_per_commit_a_small_write_goes_to_the_writer_thread(
    tmp_path: Path,
) -> None:
    async with open_store(tmp_path / "db", synchronous="full") as store:
        await store.write(lambda c: None)
        assert await store.write(thread_of, small=True) != threading.get_ident()


async def test_a_small_write_fires_its_wake_ups_once_committed(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: None)  # the writer's flusher runs from now on
        woken = store.wakeups.event("test", "k")

        def tx(conn: Any) -> int:
            wake.notify(conn, "test", "k")
            assert not woken.is_set()
            return threading.get_ident()

        assert await store.write(tx, small=True) == threading.get_ident()
        assert woken.is_set()


async def test_the_trio_thread_leaves_the_checkpoint_to_the_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint fsyncs: once the WAL reaches CHECKPOINT_PAGES, small writes go to the writer
    thread, whose commit checkpoints; then the WAL starts again from its beginning."""
    monkeypatch.setattr(sqlite, "CHECKPOINT_PAGES", 4)
    async with open_store(tmp_path / "db") as store:
        backend = store.backend
        assert isinstance(backend, sqlite.SqliteBackend)
        await store.write(lambda c: c.execute("CREATE TABLE t(x INTEGER)"))
        here = threading.get_ident()
        pages: list[int] = []
        threads: list[bool] = []
        for i in range(12):

            def insert(conn: Any, i: int = i) -> int:
                conn.execute("INSERT INTO t VALUES (?)", (i,))
                return threading.get_ident()

            threads.append(await store.write(insert, small=True) == here)
            pages.append(backend._wal_pages)
            await wait_all_tasks_blocked()  # a new scheduler pass, as between two acks
        # On the trio thread while below the threshold; the commit that reaches it does not
        # checkpoint there: the next write goes to the writer thread, whose commit does (0: the
        # next commit starts the WAL again from its beginning), and the trio thread goes on.
        assert pages == [4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0]
        assert threads == [
            True,
            False,
            True,
            True,
            True,
            True,
            False,
            True,
            True,
            True,
            True,
            False,
        ]
        assert await store.read(lambda c: one(c, "SELECT count(*) FROM t")[0]) == 12


async def test_small_writes_keep_their_order_with_the_others(store: Store) -> None:
    """On either backend (PostgreSQL never commits on the trio thread)."""
    await store.write(lambda c: c.execute("CREATE TABLE t(x BIGINT)"))

    async def append(x: int, small: bool) -> None:
        await store.write(lambda c: c.execute("INSERT INTO t VALUES (?)", (x,)), small=small)

    for x in range(10):
        await append(x, small=x % 2 == 0)
    async with trio.open_nursery() as nursery:
        for x in range(10, 20):
            nursery.start_soon(append, x, x % 3 == 0)
    rows = await store.read(lambda c: [r[0] for r in c.execute("SELECT x FROM t")])
    assert rows[:10] == list(range(10))
    assert sorted(rows) == list(range(20))
    on_trio = await store.write(thread_of, small=True) == threading.get_ident()
    assert on_trio == (store.backend.name == "sqlite")
