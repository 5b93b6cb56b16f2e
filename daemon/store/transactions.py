# How the writer's jobs become transactions on the store's one write connection, in whichever
# thread holds it (daemon/store/writer.py keeps the queue, the hand-overs and the wake-ups).
#
# Why this shape: a group runs optimistically, in one transaction without savepoints; after a
# job fails, the others run again with a savepoint each (see writer.py's module comment). What
# the database answered sets the store's health. A group the backend may run again (PostgreSQL:
# a lost connection, a serialization failure) runs again after a rollback or a reconnect. A small
# write may also commit alone, on the trio thread, when the backend says the commit waits for
# nothing (`_commit_alone`): it never retries or sleeps there; when it fails it rolls back and
# the caller queues it as usual. `Transactions` is the Store's base class (the same object and
# attributes), kept apart to keep each module to one concern.
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from daemon.logs import get_logger
from daemon.store import wake
from daemon.store.contract import Backend, StoreHealth, StoreStats
from daemon.store.drivers import CURSORS, STORAGE_ERRORS

if TYPE_CHECKING:
    from daemon.store.writer import _WriteJob

log = get_logger("store")


class _RetryGroup(Exception):
    """The backend says the whole group may run again (raised inside the writer thread)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class Transactions:
    """Runs write jobs in transactions on `_writer` (Store's base: Store sets the attributes)."""

    backend: Backend
    stats: StoreStats
    inline: bool
    busy_since: float | None
    _writer: Any
    _control: Callable[[str], Any]
    _send_wakeup: Callable[[Any, str], None] | None
    _stopping: bool
    _health: StoreHealth

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

    def _run_group(self, group: list[_WriteJob]) -> None:
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

    def _commit_alone(self, job: _WriteJob) -> bool:
        """`job` in a transaction of its own, if the backend commits quickly now (the caller holds
        the writer's lock); False when it did not commit (not quick, or it failed and rolled
        back: nothing recorded, the caller queues it)."""
        conn, run = self._writer, self._control
        if not self.backend.commits_quickly(conn):
            return False
        try:
            run("BEGIN")
            _run_job(job, conn, self._send_wakeup)
            run("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(Exception):
                if self.backend.in_transaction(conn):
                    run("ROLLBACK")
            if not isinstance(exc, Exception):
                raise
            return False
        stats = self.stats
        stats.transactions += 1
        stats.write_jobs += 1
        stats.largest_group = max(stats.largest_group, 1)
        return True

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


def _run_job(job: _WriteJob, conn: Any, send: Callable[[Any, str], None] | None) -> None:
    wake.begin(job, send)
    try:
        result = job.fn(conn)
    finally:
        wake.end()
    if isinstance(result, CURSORS):
        result.close()  # type: ignore[attr-defined]  # an open writer cursor freed on the trio thread would wait for its lock
    job.result = result
