# The embedded backend: one SQLite file in WAL mode through APSW (the default store).
#
# Why this shape: it is the half of the store that knows SQLite — opening and configuring
# connections, the migration folder and `user_version`, which errors mean the file cannot take
# writes, and the one-process lock on the state dir. The group-committing writer, the reader
# limiter and the trio side live in `daemon.store` and are the same for both backends; an APSW
# connection already speaks the store contract (execute, executemany, changes), so areas get it
# as it is, with no wrapper on the hot path.
#
# The WAL checkpoint is ours, not SQLite's automatic one (same threshold, same PASSIVE mode, after
# the commit that reaches it): a checkpoint fsyncs, so it is left to the writer thread when the
# store commits a small write on the trio thread (daemon/store/writer.py, `commits_quickly`).
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import apsw
import apsw.bestpractice
import trio

from daemon.logs import get_logger
from daemon.store.errors import StoreUnavailable
from daemon.store.migrations import shipped

T = TypeVar("T")
log = get_logger("store")

APPLICATION_ID = 0x63726C64  # "crld"
CHECKPOINT_PAGES = 1000
"""WAL pages from which each commit checkpoints (SQLite's own automatic checkpoint's default)."""

apsw.bestpractice.apply(
    (
        apsw.bestpractice.connection_wal,
        apsw.bestpractice.connection_enable_foreign_keys,
        apsw.bestpractice.connection_dqs,
        apsw.bestpractice.connection_recursive_triggers,
    )
)

STORAGE_ERRORS: tuple[type[BaseException], ...] = (
    apsw.FullError,
    apsw.IOError,
    apsw.CantOpenError,
    apsw.ReadOnlyError,
    apsw.CorruptError,
    apsw.NoMemError,
)
"""Errors that mean the database cannot take writes at all (disk full, I/O), not a bad job."""


class StateDirLocked(StoreUnavailable):
    """Another live crawld holds this state dir."""


def one(conn: Any, sql: str, bindings: tuple[Any, ...] = ()) -> Any:
    """The first row of a query that always returns one (aggregates, RETURNING, pragmas)."""
    row = conn.execute(sql, bindings).fetchone()
    if row is None:
        raise LookupError(f"query returned no row: {sql}")
    return row


def _now_ms(*_: Any) -> int:
    """`crawld_now_ms()` in SQL: the clock leases are judged by (PostgreSQL has its own)."""
    return time.time_ns() // 1_000_000


def migrate(conn: apsw.Connection) -> int:
    """Apply pending migrations in one transaction; return the schema version."""
    steps = shipped("sqlite")
    with conn:
        current = one(conn, "pragma user_version")[0]
        latest = steps[-1][0] if steps else 0
        if current > latest:
            raise StoreUnavailable(
                f"sqlite: database schema version {current} is newer than this crawld ({latest});"
                " run the crawld that wrote it, or a newer one"
            )
        for version, name, sql in steps:
            if version > current:
                log.info("applying migration", backend="sqlite", migration=name)
                conn.execute(sql)
        conn.execute(f"pragma user_version={latest}")
        conn.execute(f"pragma application_id={APPLICATION_ID}")
    return latest


class SqliteBackend:
    """One database file: a writer connection, `readers` reader connections."""

    name = "sqlite"
    storage_errors = STORAGE_ERRORS
    rolled_back: tuple[type[BaseException], ...] = ()
    shared = False
    """A file only this process opens: one cluster member."""
    probe_every: float | None = None
    errors: tuple[type[BaseException], ...] = (apsw.Error,)

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "normal",
        busy_timeout: float = 5.0,
        readers: int = 2,
    ) -> None:
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        self.readers = readers
        self.location = str(path)
        self._pool: list[apsw.Connection] = []
        self._wal_pages = 0
        """The WAL's size after the last commit (only the writer connection commits)."""

    def connect(self) -> apsw.Connection:
        conn = apsw.Connection(str(self.path), statementcachesize=256)
        conn.setbusytimeout(int(self.busy_timeout * 1000))
        conn.execute("pragma journal_mode=wal")
        conn.execute(f"pragma synchronous={self.synchronous}")
        conn.execute("pragma foreign_keys=on")
        conn.create_scalar_function("crawld_now_ms", _now_ms, 0)
        conn.set_wal_hook(self._wal_written)
        return conn

    def _wal_written(self, conn: apsw.Connection, name: str, pages: int) -> int:
        """After each commit (instead of SQLite's automatic checkpoint): a PASSIVE checkpoint
        once the WAL holds CHECKPOINT_PAGES, except on the trio thread (the writer thread's next
        commit does it)."""
        self._wal_pages = pages
        if pages >= CHECKPOINT_PAGES and not trio.lowlevel.in_trio_run():
            # As SQLite's own: the commit stands whatever the checkpoint does.
            with contextlib.suppress(apsw.Error):
                log_pages, copied = conn.wal_checkpoint(name)
                if copied == log_pages:  # the next commit starts the WAL again (no reader in it)
                    self._wal_pages = 0
        return apsw.SQLITE_OK

    def commits_quickly(self, conn: apsw.Connection) -> bool:
        """No fsync per commit (WAL, synchronous=normal), no other process to wait for (the
        state dir's lock), and no checkpoint due."""
        return self.synchronous == "normal" and self._wal_pages < CHECKPOINT_PAGES

    def open_readers(self) -> None:
        self._pool = [self.connect() for _ in range(self.readers)]

    def control(self, conn: apsw.Connection) -> Callable[[str], Any]:
        """Runs BEGIN/SAVEPOINT/RELEASE/COMMIT (one reused cursor is cheaper than one per call)."""
        return conn.cursor().execute

    @staticmethod
    def in_transaction(conn: apsw.Connection) -> bool:
        return not conn.getautocommit()

    def retryable(self, exc: BaseException, committing: bool) -> bool:
        """SQLite has one writer: nothing to retry the whole group for."""
        return False

    def reconnect(self, conn: apsw.Connection) -> apsw.Connection:  # pragma: no cover
        return conn

    def migrate(self, conn: apsw.Connection) -> int:
        return migrate(conn)

    def read(self, fn: Callable[[apsw.Connection], T]) -> T:
        """Run fn on a free reader connection (the caller's limiter keeps one free)."""
        conn = self._pool.pop()
        try:
            with conn:
                result = fn(conn)
            return result
        finally:
            self._pool.append(conn)

    def halt(self) -> None:
        """The store stops (nothing waits on SQLite)."""

    def columns(self, conn: apsw.Connection) -> dict[str, list[tuple[str, str]]]:
        """{table: [(column, declared type)]} of every crawld table."""
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table'"
                " AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        return {t: [(r[1], r[2]) for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}

    def hold(self, instance: str | None = None) -> contextlib.AbstractContextManager[None]:
        """Keep every other crawld off this database while inside (the state dir's lock): a
        file has one process, so one cluster member."""
        return hold_state_dir(self.path.parent)

    def after_copy(self, conn: apsw.Connection) -> None:
        """Nothing to do: SQLite numbers new rows from the largest id present."""

    def wakeup_sender(self) -> None:
        """None: one process, every wake-up is fired in it after the commit."""
        return None

    async def listen(self, wakeups: Any) -> None:
        """Nothing to listen to: no other process writes this file."""

    async def guard(self, busy_since: Any) -> None:
        """Nothing to guard: no other process holds this file's locks for long (busy_timeout)."""

    def close(self, writer: apsw.Connection) -> None:
        with contextlib.suppress(apsw.Error):
            writer.execute("pragma optimize")
        for conn in [writer, *self._pool]:
            conn.close()


@contextlib.contextmanager
def hold_state_dir(state_dir: Path) -> Iterator[None]:
    """Hold `state_dir/crawld.lock` while inside; StateDirLocked if another process holds it.

    An flock dies with its process (kill -9 included), so a crash never leaves it stuck. The
    file holds the pid of the holder, named in the error of a second process."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "crawld.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StateDirLocked(
            f"sqlite: state dir {state_dir} is in use by another crawld (pid {holder}); one process"
            " per state dir: stop it, or give this one another [daemon] state_dir"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
