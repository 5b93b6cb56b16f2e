from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from daemon.store import (
    Store,
    StoreClosed,
    StoreHealth,
    migrate,
    one,
    open_store,
)
from daemon.store.migrations import shipped


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
    latest = shipped("sqlite")[-1][0]
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


# Group commit, a failing job rolling back only itself and an exception reaching its caller are
# in test_contract.py, on both backends.


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


class Gate:
    """Holds the writer thread inside a job until the trio side opens it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def job(self, conn: apsw.Connection) -> str:
        self.entered.set()
        if not self.opened.wait(timeout=30):
            raise TimeoutError("gate never opened")
        return "gate"

    async def wait_entered(self) -> None:
        await trio.to_thread.run_sync(self.entered.wait, 30)


async def held_writer(store: Store, gate: Gate, nursery: trio.Nursery) -> None:
    nursery.start_soon(store.write, gate.job)
    await gate.wait_entered()


async def insert_int(store: Store, x: int) -> None:
    await store.write(lambda c: c.execute("INSERT INTO t VALUES (?)", (x,)))


async def test_the_trio_loop_runs_while_a_job_blocks_the_writer(tmp_path: Path) -> None:
    """The job waits until the trio side opens the gate: were jobs run on the trio thread, the
    loop would hang in the job and the gate would never open."""
    async with open_store(tmp_path / "db") as store:
        gate = Gate()
        async with trio.open_nursery() as nursery:
            await held_writer(store, gate, nursery)
            for _ in range(3):
                await trio.lowlevel.checkpoint()
            gate.opened.set()
        assert await store.write(lambda c: "after") == "after"


async def test_each_caller_of_a_group_gets_its_own_result(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, x TEXT)"))
        gate = Gate()
        got: dict[str, int] = {}

        async def insert(x: str) -> None:
            got[x] = await store.write(
                lambda c: one(c, "INSERT INTO t(x) VALUES (?) RETURNING id", (x,))[0]
            )

        async with trio.open_nursery() as nursery:
            await held_writer(store, gate, nursery)
            for i in range(50):
                nursery.start_soon(insert, f"v{i}")
            await wait_all_tasks_blocked()
            before = store.stats.transactions
            gate.opened.set()
        stored = dict(await store.read(lambda c: c.execute("SELECT x, id FROM t").fetchall()))
        assert got == stored
        assert len(set(got.values())) == 50
        assert store.stats.transactions - before == 1  # one group after the gate


def record_statements(conn: apsw.Connection, seen: list[str]) -> None:
    def tracer(cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
        seen.append(sql.split()[0].upper())
        return True

    conn.exec_trace = tracer


async def queue_in_order(store: Store, nursery: trio.Nursery, *jobs: Any) -> list[Any]:
    """Start one writer per job, each queued before the next starts (the writer must be held):
    the jobs form one group in this order. Returns what each caller got (value or exception)."""
    got: list[Any] = [None] * len(jobs)

    async def call(i: int, job: Any) -> None:
        try:
            got[i] = await store.write(job)
        except Exception as exc:
            got[i] = exc

    for i, job in enumerate(jobs):
        nursery.start_soon(call, i, job)
        await wait_all_tasks_blocked()
    return got


async def test_jobs_run_without_savepoints_until_one_fails(tmp_path: Path) -> None:
    seen: list[str] = []
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x INTEGER UNIQUE)"))
        await store.write(lambda c: record_statements(c, seen))
        seen.clear()
        await store.write(lambda c: c.execute("INSERT INTO t VALUES (1)"))
        assert seen == ["BEGIN", "INSERT", "COMMIT"]

        seen.clear()
        gate = Gate()
        async with trio.open_nursery() as nursery:
            await held_writer(store, gate, nursery)
            await queue_in_order(store, nursery, *(insert_job(x) for x in (2, 3)))
            gate.opened.set()
        assert seen == ["BEGIN", "COMMIT", "BEGIN", "INSERT", "INSERT", "COMMIT"]

        seen.clear()
        gate = Gate()
        async with trio.open_nursery() as nursery:
            await held_writer(store, gate, nursery)
            got = await queue_in_order(store, nursery, *(insert_job(x) for x in (4, 1, 5)))
            gate.opened.set()
        assert isinstance(got[1], apsw.ConstraintError)
        rows = await store.read(lambda c: [r[0] for r in c.execute("SELECT x FROM t ORDER BY x")])
        assert rows == [1, 2, 3, 4, 5]
        job = ["SAVEPOINT", "INSERT", "RELEASE"]
        assert seen == [
            *["BEGIN", "COMMIT"],  # the gate
            *["BEGIN", "INSERT", "INSERT", "ROLLBACK"],  # 4, then 1 fails: all rolled back
            *["BEGIN", *job, *job, "COMMIT"],  # 4 and 5 again, each in a savepoint
        ]


def insert_job(x: int) -> Callable[[apsw.Connection], apsw.Cursor]:
    return lambda c: c.execute("INSERT INTO t VALUES (?)", (x,))


async def test_a_failing_job_makes_the_others_of_its_group_run_again(tmp_path: Path) -> None:
    """The documented price of optimistic groups: a job before the failing one runs twice, its
    first run rolled back; each caller still gets its own outcome, once."""
    runs: dict[str, int] = {}

    def counted(name: str, fail: bool = False) -> Callable[[apsw.Connection], str]:
        def job(conn: apsw.Connection) -> str:
            runs[name] = runs.get(name, 0) + 1
            conn.execute("INSERT INTO t VALUES (?)", (name,))
            if fail:
                raise ValueError(name)
            return name

        return job

    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x TEXT)"))
        gate = Gate()
        async with trio.open_nursery() as nursery:
            await held_writer(store, gate, nursery)
            got = await queue_in_order(
                store, nursery, counted("before"), counted("bad", fail=True), counted("after")
            )
            gate.opened.set()
        rows = await store.read(lambda c: sorted(r[0] for r in c.execute("SELECT x FROM t")))
    assert got[0] == "before" and got[2] == "after"
    assert isinstance(got[1], ValueError)
    assert runs == {"before": 2, "bad": 1, "after": 1}
    assert rows == ["after", "before"]


async def test_a_storage_error_in_the_middle_of_a_group_fails_only_its_job(
    tmp_path: Path,
) -> None:
    seen: list[str] = []
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(name TEXT, pad BLOB)"))
        pages = await store.read(lambda c: one(c, "pragma page_count")[0])
        await store.write(lambda c: c.execute(f"pragma max_page_count={pages + 2}"))
        await store.write(lambda c: record_statements(c, seen))

        def insert(name: str, size: int) -> Callable[[apsw.Connection], apsw.Cursor]:
            return lambda c: c.execute("INSERT INTO t VALUES (?, zeroblob(?))", (name, size))

        gate = Gate()
        seen.clear()
        async with trio.open_nursery() as nursery:
            await held_writer(store, gate, nursery)
            got = await queue_in_order(
                store, nursery, insert("a", 10), insert("big", 1_000_000), insert("c", 10)
            )
            gate.opened.set()
        stored = await store.read(lambda c: sorted(r[0] for r in c.execute("SELECT name FROM t")))
        health = store.health()
        statements = seen[2:]  # after the gate's group
    assert isinstance(got[1], apsw.FullError)
    assert not isinstance(got[0], Exception) and not isinstance(got[2], Exception)
    assert stored == ["a", "c"]
    job = ["SAVEPOINT", "INSERT", "RELEASE"]
    assert statements == [
        *["BEGIN", "INSERT", "INSERT"],  # a, then big: SQLite abandons the transaction itself
        *["BEGIN", *job, *job, "COMMIT"],  # a and c again, each in a savepoint
    ]
    assert health.writable  # the others were stored: the database takes writes


async def test_a_returned_cursor_comes_back_closed(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db") as store:
        cursor = await store.write(lambda c: c.execute("SELECT 1 UNION ALL SELECT 2"))
        assert isinstance(cursor, apsw.Cursor)
        with pytest.raises(apsw.CursorClosedError):
            cursor.fetchall()


async def test_writes_reach_the_writer_before_and_after_its_flusher_runs(tmp_path: Path) -> None:
    """Before `run_writer` starts and once its task was cancelled (the writer thread itself only
    stops through `stop_writer`), each write hands its job over itself."""
    store = await trio.to_thread.run_sync(Store, tmp_path / "db")
    await trio.to_thread.run_sync(store.open)
    try:
        async with trio.open_nursery() as nursery:
            early: list[int] = []

            async def write_early() -> None:
                early.append(await store.write(lambda c: 1))

            nursery.start_soon(write_early)
            await wait_all_tasks_blocked()
            scope = trio.CancelScope()

            async def run_writer() -> None:
                with scope:
                    await store.run_writer()

            nursery.start_soon(run_writer)
            assert await store.write(lambda c: 2) == 2
            scope.cancel()  # the flusher is woken with Cancelled but has not run yet
            assert await store.write(lambda c: 3) == 3
            await wait_all_tasks_blocked()
            assert await store.write(lambda c: 4) == 4
            store.stop_writer()
        assert early == [1]
    finally:
        await trio.to_thread.run_sync(store.close)


async def test_a_failing_job_alone_stores_nothing(tmp_path: Path) -> None:
    def half_then_fail(conn: apsw.Connection) -> None:
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("INSERT INTO t VALUES (1)")

    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x INTEGER UNIQUE)"))
        with pytest.raises(apsw.ConstraintError):
            await store.write(half_then_fail)
        assert await store.read(lambda c: one(c, "SELECT count(*) FROM t")[0]) == 0
        await store.write(lambda c: c.execute("INSERT INTO t VALUES (1)"))
        assert await store.read(lambda c: one(c, "SELECT count(*) FROM t")[0]) == 1


async def test_a_cancelled_caller_does_not_undo_a_handed_over_write(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x TEXT)"))
        gate = Gate()
        outcome: list[str] = []

        async def insert(x: str, scope: trio.CancelScope) -> None:
            with scope:
                await store.write(lambda c: c.execute("INSERT INTO t VALUES (?)", (x,)))
                outcome.append(f"{x} returned")
            if scope.cancelled_caught:
                outcome.append(f"{x} cancelled")

        async with trio.open_nursery() as nursery:
            await held_writer(store, gate, nursery)
            handed = trio.CancelScope()
            nursery.start_soon(insert, "handed", handed)
            await wait_all_tasks_blocked()
            handed.cancel()
            early = trio.CancelScope()
            early.cancel()
            nursery.start_soon(insert, "never", early)
            await wait_all_tasks_blocked()
            gate.opened.set()
        await store.write(lambda c: None)  # the queue is FIFO: the handed-over job ran before
        stored = await store.read(lambda c: [r[0] for r in c.execute("SELECT x FROM t")])
    assert sorted(outcome) == ["handed cancelled", "never cancelled"]
    assert stored == ["handed"]


async def test_more_writers_than_the_queue_holds_all_complete(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db", group_commit_max=2) as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x INTEGER)"))
        gate = Gate()
        async with trio.open_nursery() as nursery:
            await held_writer(store, gate, nursery)
            for x in range(40):
                nursery.start_soon(insert_int, store, x)
            await wait_all_tasks_blocked()
            gate.opened.set()
        rows = await store.read(lambda c: [r[0] for r in c.execute("SELECT x FROM t")])
        assert sorted(rows) == list(range(40))
        assert store.stats.largest_group == 2


class Halt(BaseException):
    pass


async def test_a_job_raising_past_exception_fails_its_group_and_the_writer_goes_on(
    tmp_path: Path,
) -> None:
    def halt(conn: apsw.Connection) -> None:
        conn.execute("INSERT INTO t VALUES ('halt')")
        raise Halt

    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x TEXT)"))
        with pytest.raises(Halt):
            await store.write(halt)
        await store.write(lambda c: c.execute("INSERT INTO t VALUES ('after')"))
        rows = await store.read(lambda c: [r[0] for r in c.execute("SELECT x FROM t")])
    assert rows == ["after"]


async def test_writes_after_close_are_refused(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x INTEGER)"))
    with pytest.raises(StoreClosed):
        await store.write(lambda c: c.execute("INSERT INTO t VALUES (1)"))


async def test_jobs_queued_before_close_are_answered(tmp_path: Path) -> None:
    results: list[int] = []
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x INTEGER)"))
        gate = Gate()
        async with trio.open_nursery() as nursery:
            await held_writer(store, gate, nursery)

            async def insert(x: int) -> None:
                await store.write(lambda c: c.execute("INSERT INTO t VALUES (?)", (x,)))
                results.append(x)

            for x in range(5):
                nursery.start_soon(insert, x)
            await wait_all_tasks_blocked()
            store.stop_writer()
            with pytest.raises(StoreClosed):
                await store.write(lambda c: None)
            gate.opened.set()
    assert sorted(results) == list(range(5))
    conn = apsw.Connection(str(tmp_path / "db"))
    assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 5
    conn.close()


@pytest.mark.parametrize("group", [False, True])
async def test_health_follows_disk_full_and_recovery(tmp_path: Path, group: bool) -> None:
    async with open_store(tmp_path / "db") as store:
        assert store.health() == StoreHealth(writable=True)
        await store.write(lambda c: c.execute("CREATE TABLE t(pad BLOB)"))
        pages = await store.read(lambda c: one(c, "pragma page_count")[0])
        await store.write(lambda c: c.execute(f"pragma max_page_count={pages + 2}"))
        outcome: list[str] = []

        async def big() -> None:
            try:
                await store.write(lambda c: c.execute("INSERT INTO t VALUES (zeroblob(1000000))"))
                outcome.append("stored")
            except apsw.FullError:
                outcome.append("full")

        gate = Gate()
        async with trio.open_nursery() as nursery:
            if group:
                await held_writer(store, gate, nursery)
                nursery.start_soon(big)
            nursery.start_soon(big)
            await wait_all_tasks_blocked()
            gate.opened.set()
        assert outcome == ["full", "full"] if group else ["full"]
        health = store.health()
        assert not health.writable
        assert health.reason is not None and health.reason.startswith("FullError")
        assert health.since_ms is not None and health.since_ms > 1_600_000_000_000
        await big()
        assert store.health().since_ms == health.since_ms  # the first failure's time stays
        await store.write(lambda c: c.execute("pragma max_page_count=1000000"))
        await big()
        assert outcome[-1] == "stored"
        assert store.health() == StoreHealth(writable=True)


async def test_reads_and_write_jobs_are_counted(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db") as store:
        await store.write(lambda c: c.execute("CREATE TABLE t(x INTEGER)"))
        reads, jobs = store.stats.reads, store.stats.write_jobs
        for x in range(3):
            await insert_int(store, x)
            await store.read(lambda c: c.execute("SELECT count(*) FROM t").fetchone())
        assert (store.stats.reads - reads, store.stats.write_jobs - jobs) == (3, 3)
