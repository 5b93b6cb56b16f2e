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
# - SQLite calls block, so they run off the trio thread: writes in the writer thread (started
#   through trio.to_thread with a limiter of its own) and reads in worker threads behind the
#   store's own CapacityLimiter, so the HTTP layer's threads cannot starve the store (and the
#   other way round). On the trio thread a write only queues, parks and is rescheduled.
# - One exception: a write its caller marks small (a webhook drainer's ack cursor, awaited before
#   the next event goes out) commits on the trio thread when nothing is queued for the writer
#   thread, it is the first write of its scheduler pass (concurrent ones still share a group)
#   and the backend says the commit waits for nothing (SQLite in WAL mode, no fsync per commit,
#   the checkpoint left to the writer thread: `Backend.commits_quickly`). The two thread
#   hand-overs cost three times the commit and more under load; the writer's lock, taken
#   without waiting, keeps the connection to one thread at a time, and a write that fails there
#   is queued as usual.
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
# - How a group becomes transactions (savepoints after a failure, retries, health) is the base
#   class's, in daemon/store/transactions.py.
from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from daemon.logs import get_logger
from daemon.store import wake
from daemon.store.backends import file_backend
from daemon.store.contract import Backend, StoreHealth, StoreStats
from daemon.store.errors import StoreClosed
from daemon.store.transactions import Transactions
from daemon.store.wake import SAFETY_S, Wakeups

T = TypeVar("T")
log = get_logger("store")
PROBE_LISTENING = 5
"""How many times longer the probe waits while the LISTEN connection would notice first."""


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


class Store(Transactions):
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
        self._writer_lock = threading.Lock()
        """Held by whichever thread runs a transaction on `_writer`."""
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

    async def write(self, fn: Callable[[Any], T], *, small: bool = False) -> T:
        """Run fn(conn) in the writer's next transaction; its return value or exception comes back.

        The transaction commits before this returns. Cancelling the caller does not undo a write
        that was already handed to the writer thread; a job still waiting for its hand-over (the
        rest of the scheduler pass) is dropped. `fn` runs in the writer thread and may run again
        in a fresh transaction when another job of its group fails (or SQLite abandons the first
        transaction: disk full, I/O error), so it should only touch the database and its own
        return value. A cursor it returns comes back closed (it belongs to the writer's
        connection).

        `small`: a few rows, awaited on a hot path. When it is the first write of its scheduler
        pass, nothing else is queued and the backend commits quickly, it commits on the trio
        thread instead, in a transaction of its own (in the same order with the other writes:
        all of them committed before it), and returns without yielding to other tasks; when that
        fails it is queued as usual, and `fn` runs again.
        """
        if small and self._flusher is not None and self._flushing and not self._queued:
            await trio.lowlevel.checkpoint_if_cancelled()
            done = self._commit_here(fn)
            if done is not None:
                # Wake the flusher (it runs in the next pass): until then this pass's other
                # writes queue, and small ones made together (many drainers acking) share a
                # group in the writer thread instead of as many commits on this one.
                self._wake_flusher()
                return done.result
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
        if self._flusher is not None:  # the first job of this scheduler pass
            self._wake_flusher()
        elif not self._flushing:
            self._hand_over()
        await trio.lowlevel.wait_task_rescheduled(job.abandon)
        if job.error is not None:
            raise job.error
        return job.result

    def _wake_flusher(self) -> None:
        """Let the parked flusher run in the next scheduler pass (if it is parked)."""
        if self._flusher is not None:
            trio.lowlevel.reschedule(self._flusher)
            self._flusher = None

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

    def _commit_here(self, fn: Callable[[Any], Any]) -> _WriteJob | None:
        """A small write with nothing queued: commit it on this thread when the writer thread is
        idle and the backend's commit waits for nothing; None when it did not commit (the
        caller queues it: `fn` may run again, as after a failed group)."""
        lock = self._writer_lock
        if not self._health.writable or not lock.acquire(blocking=False):
            return None
        try:
            job = _WriteJob(fn, None, None)
            if not self._commit_alone(job):
                return None
        finally:
            lock.release()
        self._fire(job.notes)
        return job

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
                with self._writer_lock:
                    self._run_group(group)
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

    def open(self) -> None:
        self.schema_version = self.backend.migrate(self._writer)
        self.backend.open_readers()

    def close(self) -> None:
        self._closed = True
        self.backend.close(self._writer)


def _probe(conn: Any) -> None:
    conn.execute("SELECT 1").fetchall()


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
