# The store's writer: `await store.write(fn)` and `await store.read(fn)` on whichever backend it
# is handed (daemon/store/backends.py chooses one; daemon/store/contract.py is what it needs).
#
# Why this shape:
# - SQLite allows one writer at a time (and on PostgreSQL one writer per instance keeps every
#   area's transactions exactly as they are: same grouping, same order), so the daemon has
#   exactly one write connection, owned by one writer thread that lives as long as the store.
#   Callers hand it small functions (`await store.write(fn)`) and park. The writer takes every
#   job that is waiting (up to `group_commit_max`) and runs them in ONE transaction. Under load
#   that turns hundreds of fsync-bound commits into one (group commit).
# - Groups are optimistic: the jobs run without a savepoint each. When one raises, the transaction
#   rolls back and that job gets its exception, which is the one it would have got with savepoints
#   (the jobs before it ran the same way); the others run again in a fresh transaction, each in its
#   own savepoint this time, so a failing job still rolls back only itself. Jobs rarely fail, and a
#   savepoint per job cost about a quarter of the writer's time per job.
# - The per-write overhead is what an acknowledgement or a webhook cursor pays on every event, and
#   both threads pay it under one GIL, so the path is short on both sides: a write appends its job
#   to a list and parks its own task (no event, no checkpoint of its own); a flusher task, woken by
#   the first write of a scheduler pass, runs in the next pass and hands the whole list over with
#   one queue put, so the writer thread wakes once per pass, not once per job; one call into trio
#   per group (`TrioToken.run_sync_soon`) wakes every caller of that group. A lone write pays one
#   extra scheduler pass for this.
# - A cursor a job returns belongs to the writer's connection: the writer closes it before handing
#   it back, so no other thread touches that connection (APSW frees an open cursor under the
#   connection's lock, and retries from the trio thread while the writer holds it).
# - SQLite calls block, so they never run on the trio thread: writes run in the writer thread
#   (started through trio.to_thread with a limiter of its own) and reads in worker threads behind
#   the store's own CapacityLimiter, so the HTTP layer's threads cannot starve the store (and the
#   other way round). On the trio thread a write only queues, parks and is rescheduled.
# - Readers use separate connections, each call a consistent snapshot (WAL; REPEATABLE READ).
# - What differs between the backends (connections, migrations, which errors mean the database
#   cannot take writes, which let a whole group run again) is the backend's: this module's code
#   never imports, builds or tests for a particular backend (the errors and cursors of either
#   driver it must recognise come from daemon/store/drivers.py, a bare path's backend from
#   daemon/store/backends.py). On PostgreSQL a lost connection or a serialization failure runs
#   the group again once the writer has reconnected, unless COMMIT was already sent: then the
#   outcome is unknown and the callers get the error, as they would a disk error.
# - Wake-ups (daemon/store/wake.py) ride on the writes: a job's `notify(conn, ...)` calls are
#   fired here once its group committed, and the backend sends them to other processes (on
#   PostgreSQL, pg_notify inside the transaction; its LISTEN side runs beside the writer).
from __future__ import annotations

import contextlib
import os
import queue
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from daemon.logs import get_logger
from daemon.store import wake
from daemon.store.backends import file_backend
from daemon.store.contract import Backend, StoreHealth, StoreStats
from daemon.store.drivers import CURSORS, STORAGE_ERRORS
from daemon.store.errors import StoreClosed
from daemon.store.wake import SAFETY_S, Wakeups

T = TypeVar("T")
log = get_logger("store")
PROBE_LISTENING = 5
"""How many times longer the probe waits while the LISTEN connection would notice first."""


class _RetryGroup(Exception):
    """The backend says the whole group may run again (raised inside the writer thread)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _WriteJob:
    """One `write(fn)`: filled in by the writer thread, read by `task` once rescheduled."""

    __slots__ = ("error", "fn", "notes", "result", "store", "task")

    def __init__(
        self,
        fn: Callable[[Any], Any],
        task: trio.lowlevel.Task | None,
        store: Store | None,
    ) -> None:
        self.fn = fn
        self.task = task
        """The caller to wake; None once it stopped waiting (cancelled)."""
        self.store = store
        self.result: Any = None
        self.error: BaseException | None = None
        self.notes: set[tuple[str, str]] | None = None
        """The wake-ups its transaction sent (fired here once it committed)."""

    def abandon(self, raise_cancel: Any) -> trio.lowlevel.Abort:
        # A job still on the trio thread is dropped; one handed over stays queued: a cancelled
        # caller does not undo a write already handed to the writer.
        self.task = None
        store = self.store
        if store is not None and self in store._pending:
            store._pending.remove(self)
            store._answered(1)
        return trio.lowlevel.Abort.SUCCEEDED


class Store:
    """The daemon's database: `await write(fn)` and `await read(fn)` with fn(conn) -> value."""

    inline = False
    """Run every write and read on the trio thread (tests under `autojump_clock` only: a task
    waiting for a thread looks idle to it, so virtual time would jump while a query runs)."""

    def __init__(
        self,
        target: Path | Backend,
        *,
        synchronous: str = "normal",
        busy_timeout: float = 5.0,
        group_commit_max: int = 256,
        readers: int = 2,
    ) -> None:
        if isinstance(target, Path):
            target = file_backend(
                target, synchronous=synchronous, busy_timeout=busy_timeout, readers=readers
            )
        self.backend: Backend = target
        self.path = target.location
        """Where the data lives: the file, or the server and schema (for /status and errors)."""
        self.group_commit_max = group_commit_max
        self.stats = StoreStats()
        self.schema_version = 0
        self._writer = target.connect()
        self._control = target.control(self._writer)
        """Runs BEGIN/SAVEPOINT/RELEASE/COMMIT."""
        self._jobs: queue.SimpleQueue[list[_WriteJob] | None] = queue.SimpleQueue()
        """Lists of jobs for the writer thread; None stops it."""
        self._pending: list[_WriteJob] = []
        """Jobs of this scheduler pass, not yet handed over (trio thread only)."""
        self._flusher: trio.lowlevel.Task | None = None
        """The task that hands `_pending` over, while it waits to be woken."""
        self._flushing = False
        """A flusher runs and the store is not stopping. Otherwise (before `run_writer`, after
        it ends) each write hands its job over itself."""
        self._queued = 0
        """Jobs handed to the writer and not yet answered (trio thread only)."""
        self._max_queued = group_commit_max * 4
        self._room = trio.lowlevel.ParkingLot()
        """Writers waiting while `_max_queued` jobs are queued."""
        self._token: trio.lowlevel.TrioToken | None = None
        self._reader_limiter = trio.CapacityLimiter(target.readers)
        self._writer_limiter = trio.CapacityLimiter(1)
        self.busy_since: float | None = None
        """`time.monotonic()` when the writer thread started its current group (None: idle)."""
        self._stopping = False
        self._inline_stopped = trio.Event()
        self._closed = False
        self._health = StoreHealth(writable=True)
        self.wakeups = Wakeups(SAFETY_S if target.shared else None)
        """Events the writes' `notify` calls set (daemon/store/wake.py)."""
        self._send_wakeup = target.wakeup_sender()

    def health(self) -> StoreHealth:
        """Whether the last write transaction could be stored (False after disk full, I/O error)."""
        return self._health

    def _storage_failed(self, exc: BaseException) -> None:
        if self._health.writable:
            log.error(
                "the database cannot take writes",
                backend=self.backend.name,
                error=f"{type(exc).__name__}: {exc}",
            )
            reason = f"{type(exc).__name__}: {exc}"
            self._health = StoreHealth(False, reason, time.time_ns() // 1_000_000)

    def _storage_ok(self) -> None:
        if not self._health.writable:
            log.warning("the database takes writes again", since_ms=self._health.since_ms)
            self._health = StoreHealth(writable=True)

    async def write(self, fn: Callable[[Any], T]) -> T:
        """Run fn(conn) in the writer's next transaction; its return value or exception comes back.

        The transaction commits before this returns. Cancelling the caller does not undo a write
        that was already handed to the writer thread; a job still waiting for its hand-over (the
        rest of the scheduler pass) is dropped. `fn` runs in the writer thread and may run again
        in a fresh transaction when another job of its group fails (or SQLite abandons the first
        transaction: disk full, I/O error), so it should only touch the database and its own
        return value. A cursor it returns comes back closed (it belongs to the writer's
        connection).
        """
        if not self._flushing or self._queued >= self._max_queued:
            if self.inline:
                await trio.lowlevel.checkpoint_if_cancelled()
                return self._write_inline(fn)
            await self._before_slow_write()
        # No checkpoint before queueing: a caller already cancelled gets Cancelled from the wait
        # below, and `abandon` drops its job, which is still on the trio thread.
        job = _WriteJob(fn, trio.lowlevel.current_task(), self)
        self._queued += 1
        self._pending.append(job)
        if self._flusher is not None:  # the first job of this scheduler pass: wake the flusher
            trio.lowlevel.reschedule(self._flusher)
            self._flusher = None
        elif not self._flushing:
            self._hand_over()
        await trio.lowlevel.wait_task_rescheduled(job.abandon)
        if job.error is not None:
            raise job.error
        return job.result

    async def _before_slow_write(self) -> None:
        """No flusher runs, or the queue is full: check for cancellation (the job would be
        handed over at once), wait for room, refuse writes once stopping."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while self._queued >= self._max_queued and not self._stopping:
            await self._room.park()
        if self._stopping or self._closed:
            raise StoreClosed(f"store ({self.backend.name}) is closed")

    def _write_inline(self, fn: Callable[[Any], T]) -> T:
        if self._stopping or self._closed:
            raise StoreClosed(f"store ({self.backend.name}) is closed")
        job = _WriteJob(fn, None, None)
        self._commit_group([job])
        if job.error is not None:
            raise job.error
        self._fire(job.notes)
        return job.result

    async def read(self, fn: Callable[[Any], T]) -> T:
        """Run fn(conn) on a reader connection (a consistent snapshot per call)."""
        if self._closed:
            raise StoreClosed(f"store ({self.backend.name}) is closed")
        self.stats.reads += 1
        if self.inline:
            await trio.lowlevel.checkpoint()
            return self.backend.read(fn)
        async with self._reader_limiter:
            return await trio.to_thread.run_sync(self.backend.read, fn)

    async def run_writer(self) -> None:
        """Run the writer thread until `stop_writer()`; every job queued before that is answered
        first."""
        self._token = trio.lowlevel.current_trio_token()
        if self.inline:
            await self._inline_stopped.wait()
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._flush_loop)
            nursery.start_soon(self.backend.listen, self.wakeups)
            nursery.start_soon(self.backend.guard, lambda: self.busy_since)
            if self.backend.probe_every is not None:
                nursery.start_soon(self._probe_loop, self.backend.probe_every)
            try:
                await trio.to_thread.run_sync(self._writer_loop, limiter=self._writer_limiter)
            finally:
                nursery.cancel_scope.cancel()

    async def _probe_loop(self, every: float) -> None:
        """A server can go away while nothing writes: a no-op write now and then finds out
        (health turns degraded, the writer starts reconnecting) before a caller has to. Any
        other transaction in the meantime found out as well: then no probe. While the LISTEN
        connection is up, a server that goes away breaks it too, and that probes at once: the
        probe's own period is then `PROBE_LISTENING` times longer."""
        wakeups = self.wakeups
        while True:
            seen = self.stats.transactions
            broken = wakeups.event(wake.PROBE)  # the LISTEN connection was lost (or is back)
            with trio.move_on_after(every * (PROBE_LISTENING if wakeups.listening else 1)):
                await broken.wait()
            if not broken.is_set() and self.stats.transactions != seen and self._health.writable:
                continue
            try:
                await self.write(_probe)
            except StoreClosed:
                return
            except Exception as exc:
                log.debug("store probe failed", backend=self.backend.name, error=str(exc))

    def stop_writer(self) -> None:
        """Refuse new writes (StoreClosed) and let the writer finish the queued ones and stop."""
        if not self._stopping:
            self._stopping = True
            self.backend.halt()
            self._flushing = False
            self._inline_stopped.set()
            self._hand_over()
            self._jobs.put(None)
            self._room.unpark_all()

    def _hand_over(self) -> None:
        """Give the writer thread every job collected on the trio thread, in one put."""
        if self._pending:
            self._jobs.put(self._pending)
            self._pending = []

    async def _flush_loop(self) -> None:
        """Hand the jobs over once per scheduler pass: woken by the pass's first write, it runs
        in the next pass, after every task of this one queued its job."""
        self._flushing = not self._stopping
        try:
            while True:
                self._hand_over()
                self._flusher = trio.lowlevel.current_task()
                await trio.lowlevel.wait_task_rescheduled(self._abort_flusher)
        finally:  # cancelled: each write hands its job over itself again
            self._flusher = None
            self._flushing = False
            self._hand_over()

    def _abort_flusher(self, raise_cancel: Any) -> trio.lowlevel.Abort:
        # At once, not in `_flush_loop`'s finally: a write before the flusher runs again must
        # neither wake it a second time nor leave its job to it.
        self._flusher = None
        self._flushing = False
        return trio.lowlevel.Abort.SUCCEEDED

    def _writer_loop(self) -> None:
        jobs, limit, token = self._jobs, self.group_commit_max, self._token
        assert token is not None
        running = True
        while running:
            batch = jobs.get()
            if batch is None:
                break
            while True:  # every list waiting: a busy writer finds several
                try:
                    more = jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    running = False
                    break
                batch += more
            for start in range(0, len(batch), limit):
                group = batch[start : start + limit] if len(batch) > limit else batch
                self.busy_since = time.monotonic()
                try:
                    self._commit_group(group)
                except BaseException as exc:  # a job raised past Exception: fail its group, go on
                    log.error("write group failed", error=f"{type(exc).__name__}: {exc}")
                    with contextlib.suppress(Exception):
                        if self.backend.in_transaction(self._writer):
                            self._control("ROLLBACK")
                    for job in group:
                        job.result = None
                        job.error = job.error or exc
                finally:
                    self.busy_since = None
                token.run_sync_soon(self._deliver, group)

    def _deliver(self, batch: list[_WriteJob]) -> None:
        """On the trio thread: wake the callers of a finished group."""
        reschedule = trio.lowlevel.reschedule
        for job in batch:
            if job.notes and job.error is None:
                self._fire(job.notes)
            if job.task is not None:
                reschedule(job.task)
        self._answered(len(batch))

    def _fire(self, notes: set[tuple[str, str]] | None) -> None:
        if notes:
            fire = self.wakeups.fire
            for channel, key in notes:
                fire(channel, key)

    def _answered(self, count: int) -> None:
        self._queued -= count
        if self._room:
            self._room.unpark_all()

    def _commit_group(self, batch: list[_WriteJob]) -> None:
        attempt = 0
        while True:
            try:
                todo = self._commit_optimistic(batch)
                while todo:
                    todo = self._commit_once(todo)
                return
            except _RetryGroup as retry:
                attempt += 1
                for job in batch:
                    job.error = job.result = None
                if not self._recover(retry.error, attempt):
                    for job in batch:
                        job.error = retry.error
                        self.stats.write_errors += 1
                    return

    def _recover(self, exc: BaseException, attempt: int) -> bool:
        """After a retryable failure: roll back or reconnect; False when the group must fail
        instead (the store stops, or it kept failing)."""
        if isinstance(exc, self.backend.storage_errors) and not isinstance(
            exc, self.backend.rolled_back
        ):
            self._storage_failed(exc)
        log.warning(
            "write transaction failed; running the group again",
            backend=self.backend.name,
            error=f"{type(exc).__name__}: {exc}",
            attempt=attempt,
        )
        try:
            if self.backend.in_transaction(self._writer):
                self._control("ROLLBACK")
                if attempt > 50:
                    return False
                time.sleep(min(0.001 * 2**attempt, 0.2))
                return True
        except Exception:
            pass
        if self._stopping or self.inline:
            return False
        try:
            self._writer = self.backend.reconnect(self._writer)
        except Exception as failed:
            log.error("the writer could not reconnect", error=str(failed))
            return False
        self._control = self.backend.control(self._writer)
        return True

    def _commit_optimistic(self, batch: list[_WriteJob]) -> list[_WriteJob]:
        """Run `batch` in one transaction without savepoints; return the jobs to run again.

        When a job raises, the transaction rolls back: that job gets its exception (the jobs
        before it ran as they would have with savepoints, so it failed as it would have), and the
        others are returned, to run again with a savepoint each.
        """
        conn, run = self._writer, self._control
        stats = self.stats
        stats.transactions += 1
        stats.write_jobs += len(batch)
        if len(batch) > stats.largest_group:
            stats.largest_group = len(batch)
        try:
            run("BEGIN")
        except Exception as exc:
            self._transaction_failed(batch, exc)
            return []
        try:
            for job in batch:
                _run_job(job, conn, self._send_wakeup)
        except Exception as exc:
            self._job_failed(job, exc)
            others = [other for other in batch if other is not job]
            try:
                if self.backend.in_transaction(conn):
                    run("ROLLBACK")
            except Exception as rollback_exc:
                self._transaction_failed(others, rollback_exc)
                return []
            for other in others:
                other.result = None
            return others
        try:
            run("COMMIT")
        except Exception as exc:
            self._transaction_failed(batch, exc, committing=True)
            return []
        self._storage_ok()
        return []

    def _job_failed(self, job: _WriteJob, exc: Exception) -> None:
        if self.backend.retryable(exc, False):
            raise _RetryGroup(exc) from exc
        job.error = exc
        job.result = None
        self.stats.write_errors += 1
        if isinstance(exc, STORAGE_ERRORS):
            self._storage_failed(exc)

    def _transaction_failed(
        self, batch: list[_WriteJob], exc: Exception, *, committing: bool = False
    ) -> None:
        """BEGIN, COMMIT or a rollback failed: nothing is stored (or, for a COMMIT whose answer
        was lost, nobody knows), every job without an error of its own gets this one."""
        if isinstance(exc, _RetryGroup):
            raise exc
        if self.backend.retryable(exc, committing):
            raise _RetryGroup(exc) from exc
        if isinstance(exc, STORAGE_ERRORS):
            self._storage_failed(exc)
        if self.backend.in_transaction(self._writer):
            with contextlib.suppress(Exception):
                self._control("ROLLBACK")
        log.error(
            "write transaction failed", backend=self.backend.name, error=str(exc), jobs=len(batch)
        )
        for job in batch:
            if job.error is None:
                job.error = exc
                job.result = None
                self.stats.write_errors += 1

    def _commit_once(self, batch: list[_WriteJob]) -> list[_WriteJob]:
        """Run `batch` in one transaction, each job in a savepoint; return the jobs to run again
        in a new one.

        Some errors (SQLITE_FULL, IOERR, NOMEM, BUSY) make SQLite abandon the whole transaction,
        not just the failing job's savepoint. Then the jobs before it were rolled back and the
        ones after it must not run outside a transaction: everything but the failed job is
        retried in a fresh transaction.
        """
        conn, run = self._writer, self._control
        self.stats.transactions += 1
        lost = False
        failed = False
        committing = False
        try:
            run("BEGIN")
            for job in batch:
                run("SAVEPOINT job")  # only this job rolls back on error
                try:
                    _run_job(job, conn, self._send_wakeup)
                except Exception as exc:
                    self._job_failed(job, exc)
                    failed = True
                    if not self.backend.in_transaction(conn):  # the whole transaction is gone
                        lost = True
                        break
                    run("ROLLBACK TO job")
                run("RELEASE job")
            if not lost:
                committing = True
                run("COMMIT")
                if not failed or not any(isinstance(job.error, STORAGE_ERRORS) for job in batch):
                    self._storage_ok()
        except Exception as exc:  # the commit (or a savepoint step) failed: nothing is stored
            self._transaction_failed(batch, exc, committing=committing)
            return []
        if not lost:
            return []
        retry = [job for job in batch if job.error is None]
        for job in retry:
            job.result = None
        log.warning(
            "write transaction abandoned by the database; retrying the other jobs",
            backend=self.backend.name,
            jobs=len(retry),
        )
        return retry

    def open(self) -> None:
        self.schema_version = self.backend.migrate(self._writer)
        self.backend.open_readers()

    def close(self) -> None:
        self._closed = True
        self.backend.close(self._writer)


def _probe(conn: Any) -> None:
    conn.execute("SELECT 1").fetchall()


def _run_job(job: _WriteJob, conn: Any, send: Callable[[Any, str], None] | None) -> None:
    wake.begin(job, send)
    try:
        result = job.fn(conn)
    finally:
        wake.end()
    if isinstance(result, CURSORS):
        result.close()  # type: ignore[attr-defined]  # an open writer cursor freed on the trio thread would wait for its lock
    job.result = result


@contextlib.asynccontextmanager
async def open_store(
    target: str | os.PathLike[str] | Backend,
    *,
    synchronous: str = "normal",
    busy_timeout: float = 5.0,
    group_commit_max: int = 256,
) -> AsyncIterator[Store]:
    """Open (creating and migrating as needed) the database and run its writer until exit.

    `target` is a SQLite file path or a backend (backend_for(cfg))."""
    if isinstance(target, (str, os.PathLike)):
        db_path = Path(target)
        await trio.to_thread.run_sync(lambda: db_path.parent.mkdir(parents=True, exist_ok=True))
        target = file_backend(db_path, synchronous=synchronous, busy_timeout=busy_timeout)
    backend = target
    store = await trio.to_thread.run_sync(lambda: Store(backend, group_commit_max=group_commit_max))
    try:
        await trio.to_thread.run_sync(store.open)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run_writer)
            try:
                yield store
            finally:
                store.stop_writer()
    finally:
        # shielded: a cancelled caller (a nursery torn down) still closes its connections
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(store.close)
