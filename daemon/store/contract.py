# The store's contract, written once for both sides of it: what an area's store function gets
# (Conn), what the store needs of a database (Backend, implemented by daemon/store/sqlite.py
# and daemon/store/postgres.py), and what the store reports (StoreHealth, StoreStats).
#
# Why protocols: the areas and the writer are written against these shapes and never against a
# driver, so a statement an area writes runs on either backend, and the writer's group commit,
# retries and wake-ups are the same code on both.
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from daemon.store.wake import Wakeups

T = TypeVar("T")


class Conn(Protocol):
    """What an area's store function gets: an APSW connection on SQLite, a `PgConn` on
    PostgreSQL. Statements use `?` placeholders and the SQL both share (daemon/store/dialect.py).
    execute returns a cursor (fetchone, fetchall, iteration); executemany returns every row its
    executions yield (a SELECT or RETURNING), in order; changes() counts the rows the last
    execute changed."""

    def execute(self, sql: str, bindings: Any = ..., /) -> Any: ...
    def executemany(self, sql: str, seq: Any, /) -> Any: ...
    def changes(self) -> int: ...


class Backend(Protocol):
    """What the store needs of a database (daemon/store/sqlite.py, daemon/store/postgres.py)."""

    name: str
    location: str
    readers: int
    storage_errors: tuple[type[BaseException], ...]
    rolled_back: tuple[type[BaseException], ...]
    shared: bool
    """Whether other processes may write to this store at the same time (cluster mode)."""
    """Errors after which the server rolled the transaction back on its own (a deadlock, a
    serialization failure): run it again; the database is fine."""
    probe_every: float | None
    """Seconds between no-op writes that check the connection (None: never, a local file)."""

    def connect(self) -> Any: ...
    def open_readers(self) -> None: ...
    def control(self, conn: Any) -> Callable[[str], Any]: ...
    def in_transaction(self, conn: Any) -> bool: ...
    def commits_quickly(self, conn: Any) -> bool:
        """Whether a small write transaction on the writer connection `conn` would commit now
        without waiting for anything (a fsync, a checkpoint, a server, another process's lock):
        the store then commits a write marked small on the trio thread while its writer thread
        is idle. A commit made there leaves what it would wait for to the writer thread's next
        one."""
        ...

    def retryable(self, exc: BaseException, committing: bool) -> bool: ...
    def reconnect(self, conn: Any) -> Any: ...
    def migrate(self, conn: Any) -> int: ...
    def read(self, fn: Callable[[Any], T]) -> T: ...
    def halt(self) -> None: ...
    def close(self, writer: Any) -> None: ...
    def columns(self, conn: Any) -> dict[str, list[tuple[str, str]]]: ...
    def hold(self, instance: str | None = None) -> contextlib.AbstractContextManager[None]:
        """Keep what may not share this store off it while inside; raises StoreUnavailable
        naming the holder. `instance`: a running crawld of that name (on PostgreSQL other
        cluster members may hold the store too, a second process of the same name may not);
        None: `store copy`, alone."""
        ...

    def after_copy(self, conn: Any) -> None: ...

    def wakeup_sender(self) -> Callable[[Any, str], None] | None:
        """What sends a wake-up payload to other processes inside a write transaction
        (None: no other process shares this store)."""
        ...

    async def guard(self, busy_since: Callable[[], float | None]) -> None:
        """Until cancelled, keep other processes' stalled transactions from holding the writer
        up for good (`busy_since`: the `time.monotonic()` start of the writer's current group,
        None when idle); returns at once when no other process shares this store."""
        ...

    async def listen(self, wakeups: Wakeups) -> None:
        """Receive other processes' wake-ups into `wakeups` until cancelled (returns at once
        when no other process shares this store)."""
        ...


@dataclass(frozen=True)
class StoreHealth:
    writable: bool
    reason: str | None = None
    """The last storage error while not writable (e.g. "FullError: database or disk is full")."""
    since_ms: int | None = None
    """When writes started failing (epoch ms)."""


@dataclass
class StoreStats:
    transactions: int = 0
    write_jobs: int = 0
    write_errors: int = 0
    largest_group: int = 0
    reads: int = 0
    """Calls of `Store.read` (each one reader transaction)."""
