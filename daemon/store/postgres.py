# The PostgreSQL backend, through psycopg 3 (sync API) and psycopg_pool.
#
# Why this shape: the store's trio side (group commit, one writer thread, readers behind a
# limiter) is the same as SQLite's, so every transaction keeps the grouping the areas were built
# around, and the blocking driver runs in worker threads like APSW does. psycopg's async API is
# asyncio-only; docs/explanations/store-contract.md has the figures of both choices. What is
# PostgreSQL's own lives here:
# - `PgConn` gives a psycopg connection the store contract the areas call (execute/executemany
#   returning rows, changes()), translating each statement once (daemon/store/dialect.py) and
#   sending it with native `$N` placeholders through a RawCursor;
# - values go and come back as SQLite takes and gives them: ints as bigint, str as text, bools
#   as integers (the schema mirrors SQLite's integer flags), numeric as int or float (not
#   Decimal);
# - the writer owns one connection of its own (reconnected with backoff when lost); reads take a
#   pooled connection and run in one REPEATABLE READ READ ONLY transaction, a consistent snapshot
#   per call as WAL gives SQLite's readers;
# - migrations run under a transaction-scoped advisory lock, so instances starting together
#   migrate once, and the lock never outlives its transaction (PgBouncer in transaction mode is
#   fine for it).
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import psycopg.errors
import psycopg_pool
from psycopg import pq
from psycopg.adapt import Dumper, Loader
from psycopg.types.numeric import Int8Dumper
from psycopg.types.string import StrDumper

from daemon.logs import get_logger
from daemon.store import pglisten, pgstalled
from daemon.store.dialect import bulk_inserts, to_postgres
from daemon.store.errors import StoreUnavailable
from daemon.store.migrations import shipped
from daemon.store.wake import Wakeups

T = TypeVar("T")
log = get_logger("store")

STORAGE_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.errors.DiskFull,
    psycopg.errors.ReadOnlySqlTransaction,
    psycopg.errors.InsufficientResources,
    psycopg_pool.PoolTimeout,
)
"""Errors that mean the server cannot take writes now (gone, disk full, read-only), not a bad
job."""

RETRY_ALWAYS: tuple[type[BaseException], ...] = (
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
)
"""The server rolled the transaction back: running the same group again is safe."""

LOCK_KEY_PREFIX = "crawld:migrate:"
INSTANCE_LOCK = 0x63726C64
"""First key of the schema lock ("crld"); the second is hashtext(schema). Running instances
share it; `store copy` takes it alone."""
MEMBER_LOCK = 0x63726C65
"""First key of an instance name's lock; the second is hashtext("schema/instance")."""


class PgUnavailable(StoreUnavailable):
    """PostgreSQL cannot be reached or refused the connection (the message names host and why)."""


class _Numeric(Loader):
    """numeric → int when whole, else float (SQLite's sums and averages are int or float)."""

    def load(self, data: Any) -> Any:
        text = bytes(data).decode()
        if "." in text or "e" in text.lower() or text in ("NaN", "Infinity", "-Infinity"):
            return float(text)
        return int(text)


class _BoolAsInt(Dumper):
    oid = psycopg.adapters.types["int8"].oid

    def dump(self, obj: Any) -> bytes:
        return b"1" if obj else b"0"


def _adapt(conn: psycopg.Connection[Any]) -> None:
    """Bind as SQLite would store: every int as bigint (psycopg would pick int2 for small values,
    and `$1 + $2` would overflow there), str as text (never parsed as bytea), bools as ints."""
    adapters = conn.adapters
    adapters.register_loader("numeric", _Numeric)
    adapters.register_dumper(bool, _BoolAsInt)
    adapters.register_dumper(int, Int8Dumper)
    adapters.register_dumper(str, StrDumper)


class _Rows:
    """What executemany returns: every row of every execution, in order, and their count."""

    __slots__ = ("_rows",)

    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def fetchall(self) -> list[Any]:
        return self._rows

    def fetchone(self) -> Any:
        return self._rows[0] if self._rows else None


class PgConn:
    """A psycopg connection speaking the store contract (see the module comment)."""

    __slots__ = ("_changes", "raw")

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw
        self._changes = 0

    def execute(self, sql: str, bindings: Sequence[Any] | None = ()) -> psycopg.RawCursor[Any]:
        cur: psycopg.RawCursor[Any] = self.raw.cursor()  # type: ignore[assignment]
        cur.execute(to_postgres(sql).sql, bindings or None)
        self._changes = max(cur.rowcount, 0)
        return cur

    def executemany(self, sql: str, seq: Any) -> _Rows:
        statement = to_postgres(sql)
        params = list(seq)
        if not params:
            self._changes = 0
            return _Rows([])
        cur = self.raw.cursor()
        if statement.bulk is not None and len(params) > 1:
            for sql, flat in bulk_inserts(statement, params):
                cur.execute(sql, flat)
            self._changes = len(params)
            return _Rows([])
        cur.executemany(statement.sql, params, returning=statement.returns_rows)
        rows: list[Any] = []
        if statement.returns_rows:
            for result in cur.results():
                rows.extend(result.fetchall())
        self._changes = max(cur.rowcount, 0)
        return _Rows(rows)

    def changes(self) -> int:
        """Rows changed by the last execute (as SQLite's changes())."""
        return self._changes

    def getautocommit(self) -> bool:
        """Not inside a transaction (also: the connection is gone, so is its transaction)."""
        return self.raw.info.transaction_status not in (
            pq.TransactionStatus.INTRANS,
            pq.TransactionStatus.INERROR,
            pq.TransactionStatus.ACTIVE,
        )


@dataclass(frozen=True)
class ServerInfo:
    """What `check-config --secrets` reports of a PostgreSQL store."""

    server_version: str
    schema: str
    schema_version: int | None
    """None: the schema is not created yet (the first start creates it)."""
    latest: int
    can_create: bool
    """The role may create the schema (when missing) or tables in it."""
    user: str
    host: str


def describe_dsn(dsn: str) -> str:
    """host:port/dbname of a DSN, without its password (for messages)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "an invalid DSN"
    host = info.get("host") or os.environ.get("PGHOST") or "localhost"
    port = info.get("port") or os.environ.get("PGPORT") or "5432"
    db = info.get("dbname") or os.environ.get("PGDATABASE") or info.get("user") or ""
    return f"{host}:{port}/{db}"


def connect(
    dsn: str, schema: str, *, timeout: float = 10.0, **extra: Any
) -> psycopg.Connection[Any]:
    """A configured connection (autocommit, RawCursor, search_path), or PgUnavailable.
    `extra`: more connection parameters (e.g. keepalives)."""
    try:
        conn = psycopg.Connection.connect(
            dsn,
            autocommit=True,
            cursor_factory=psycopg.RawCursor,
            connect_timeout=max(1, int(timeout)),
            application_name=application_name(schema),
            **extra,
        )
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise PgUnavailable(f"postgres: cannot connect to {describe_dsn(dsn)}: {reason}") from exc
    _configure(conn, schema)
    return conn


def application_name(schema: str) -> str:
    """What crawld's connections to `schema` call themselves (pg_stat_activity)."""
    return f"crawld {schema}"[:63]


def _configure(conn: psycopg.Connection[Any], schema: str) -> None:
    _adapt(conn)
    conn.execute("SELECT set_config('search_path', $1, false)", (_quote_ident(schema),))


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PostgresBackend:
    """One schema of one PostgreSQL database: a writer connection and a pool of readers."""

    name = "postgres"
    storage_errors = STORAGE_ERRORS
    rolled_back = RETRY_ALWAYS
    shared = True
    """Other crawld processes (cluster members) may write to the same schema."""
    probe_every: float | None = 2.0
    errors: tuple[type[BaseException], ...] = (psycopg.Error, psycopg_pool.PoolTimeout)

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "crawld",
        pool_size: int = 4,
        connect_timeout: float = 10.0,
        reconnect_max: float = 10.0,
        idle_in_transaction_ms: int | None = None,
    ) -> None:
        self.dsn = dsn
        self.idle_in_transaction_ms = idle_in_transaction_ms
        """The writer's `idle_in_transaction_session_timeout`: a cluster member paused in the
        middle of a transaction (SIGSTOP, a VM freeze) holds its row locks, and with them every
        other member's writer, heartbeats included; the server ends that transaction after this
        long (a third of the lease), the others carry on, and the paused one redoes it (its
        fenced writes then find their leases gone)."""
        self.schema = schema
        self.readers = max(1, pool_size - 1)
        self.connect_timeout = connect_timeout
        self.reconnect_max = reconnect_max
        self.location = f"{describe_dsn(dsn)} schema {schema}"
        self.stop = threading.Event()
        """Set when the store stops: a writer waiting to reconnect gives up."""
        self.listen_dsn = dsn
        """Where the LISTEN connection goes: the server itself, also when writes go through a
        pooler in transaction mode (which cannot keep a LISTEN)."""
        self.channel = pglisten.channel_for(schema)
        """Where this schema's wake-ups go (daemon/store/pglisten.py)."""
        self.writer_pid: int | None = None
        """The server pid of the writer's connection (its own wake-ups are not received)."""
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None

    def connect(self) -> PgConn:
        conn = connect(self.dsn, self.schema, timeout=self.connect_timeout)
        self.writer_pid = conn.info.backend_pid
        if self.idle_in_transaction_ms:
            conn.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', $1, false)",
                (f"{self.idle_in_transaction_ms}ms",),
            )
        return PgConn(conn)

    def open_readers(self) -> None:
        schema = self.schema
        self._pool = psycopg_pool.ConnectionPool(
            self.dsn,
            min_size=self.readers,
            max_size=self.readers,
            kwargs={
                "autocommit": True,
                "cursor_factory": psycopg.RawCursor,
                "application_name": application_name(schema),
                "connect_timeout": max(1, int(self.connect_timeout)),
            },
            configure=lambda conn: _configure(conn, schema),
            check=psycopg_pool.ConnectionPool.check_connection,
            reconnect_timeout=0,
            timeout=self.connect_timeout,
            open=False,
            name="crawld-readers",
        )
        self._pool.open(wait=False)

    def control(self, conn: PgConn) -> Callable[[str], Any]:
        return conn.raw.execute

    @staticmethod
    def in_transaction(conn: PgConn) -> bool:
        return not conn.getautocommit()

    @staticmethod
    def commits_quickly(conn: PgConn) -> bool:
        """Never: every statement is a round trip to the server."""
        return False

    def retryable(self, exc: BaseException, committing: bool) -> bool:
        """Whether the whole group may run again: the server rolled it back (serialization
        failure, deadlock), or the connection was lost before COMMIT was sent (after, the
        outcome is unknown and the callers get the error)."""
        if isinstance(exc, RETRY_ALWAYS):
            return True
        return not committing and isinstance(exc, psycopg.OperationalError)

    def reconnect(self, conn: PgConn) -> PgConn:
        """A new writer connection, waiting with capped backoff; raises PgUnavailable once the
        store stops."""
        with contextlib.suppress(psycopg.Error):
            conn.raw.close()
        delay = 0.05
        while True:
            try:
                fresh = self.connect()
            except PgUnavailable as exc:
                if self.stop.is_set():
                    raise
                log.warning("postgres: reconnecting", error=str(exc), retry_in_s=round(delay, 2))
                if self.stop.wait(delay):
                    raise
                delay = min(delay * 2, self.reconnect_max)
                continue
            log.info("postgres: writer reconnected", server=self.location)
            return fresh

    def migrate(self, conn: PgConn) -> int:
        return migrate(conn.raw, self.schema)

    def read(self, fn: Callable[[PgConn], T]) -> T:
        assert self._pool is not None
        with self._pool.connection() as raw:
            raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                result = fn(PgConn(raw))
            except BaseException:
                if not raw.broken:
                    raw.execute("ROLLBACK")
                raise
            raw.execute("COMMIT")
            return result

    def wakeup_sender(self) -> Callable[[Any, str], None]:
        """pg_notify on the schema's channel: delivered to the listeners at commit."""
        return pglisten.send(self.channel)

    async def listen(self, wakeups: Wakeups) -> None:
        """LISTEN on the schema's channel on a connection of its own until cancelled."""

        def connect_listener() -> psycopg.Connection[Any]:
            return connect(
                self.listen_dsn, self.schema, timeout=self.connect_timeout, **pglisten.KEEPALIVES
            )

        await pglisten.listen(
            connect_listener,
            self.channel,
            wakeups,
            lambda: self.writer_pid,
            reconnect_max=self.reconnect_max,
        )

    async def guard(self, busy_since: Callable[[], float | None]) -> None:
        """Until cancelled: end other crawld processes' stalled sessions that hold the writer up
        (daemon/store/pgstalled.py); returns at once without `idle_in_transaction_ms`."""
        if self.idle_in_transaction_ms:
            await pgstalled.guard(
                busy_since,
                self._end_stalled,
                self.idle_in_transaction_ms,
                (psycopg.OperationalError, psycopg_pool.PoolTimeout),
            )

    def _end_stalled(self) -> list[pgstalled.Stalled]:
        pid, pool, after_ms = self.writer_pid, self._pool, self.idle_in_transaction_ms
        if pid is None or pool is None or not after_ms:
            return []
        with pool.connection(timeout=self.connect_timeout) as raw:
            return pgstalled.end_stalled(raw, pid, application_name(self.schema), after_ms)

    def halt(self) -> None:
        """The store stops: a writer waiting to reconnect gives up."""
        self.stop.set()

    def columns(self, conn: PgConn) -> dict[str, list[tuple[str, str]]]:
        """{table: [(column, data type)]} of every table in the schema but crawld_schema."""
        found: dict[str, list[tuple[str, str]]] = {}
        for table, column, kind in conn.raw.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = $1 AND table_name <> 'crawld_schema'"
            " ORDER BY table_name, ordinal_position",
            (self.schema,),
        ):
            found.setdefault(table, []).append((column, kind))
        return found

    @contextlib.contextmanager
    def hold(self, instance: str | None = None) -> Iterator[None]:
        """Hold this schema while inside; StoreUnavailable naming the holder when it is taken.

        `instance` given (a running crawld): a shared lock on the schema, which any number of
        cluster members take together, and the instance name's own lock, so two live processes
        never share a name. None (`store copy`): the schema's lock alone, exclusive, so no crawld
        runs while a copy reads or fills it. Session advisory locks on a connection of their
        own: they die with their process (kill -9 included) or its connection, so a crash never
        leaves one stuck."""
        conn = connect(self.dsn, self.schema, timeout=self.connect_timeout)

        def taken(lock: int, key: str, *, shared: bool = False) -> bool:
            which = "pg_try_advisory_lock_shared" if shared else "pg_try_advisory_lock"
            row = conn.execute(f"SELECT {which}($1::integer, hashtext($2))", (lock, key))
            return bool((row.fetchone() or (False,))[0])

        try:
            if not taken(INSTANCE_LOCK, self.schema, shared=bool(instance)):
                raise StoreUnavailable(
                    f"postgres: schema {self.schema} at {describe_dsn(self.dsn)} is in use by"
                    f" {'a store copy' if instance else 'a running crawld'}"
                    f" ({_holder(conn, INSTANCE_LOCK, self.schema)}): stop it first"
                )
            if instance:
                key = f"{self.schema}/{instance}"
                if not taken(MEMBER_LOCK, key):
                    raise StoreUnavailable(
                        f"postgres: instance name {instance!r} is in use on schema {self.schema}"
                        f" at {describe_dsn(self.dsn)} by another live crawld"
                        f" ({_holder(conn, MEMBER_LOCK, key)}); give this one another"
                        " [cluster] instance"
                    )
            yield
        finally:
            # Released before the connection closes: the server ends a closed session (and with
            # it the session's locks) a moment after the client goes, and a `store copy` or a
            # start right after this one must not find them still held.
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock_all()")
            conn.close()

    def after_copy(self, conn: PgConn) -> None:
        """Move identity sequences past the copied ids."""
        for (table,) in conn.raw.execute(
            "SELECT table_name FROM information_schema.columns"
            " WHERE table_schema = $1 AND column_name = 'id' AND is_identity = 'YES'",
            (self.schema,),
        ).fetchall():
            conn.raw.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"
                f" greatest((SELECT max(id) FROM {table}), 1))"
            )

    def close(self, writer: PgConn) -> None:
        self.stop.set()
        if self._pool is not None:
            self._pool.close(timeout=5)
        writer.raw.close()


def _holder(conn: psycopg.Connection[Any], lock: int, key: str) -> str:
    """Who holds advisory lock (lock, hashtext(key)), as the server sees the connection."""
    row = conn.execute(
        "SELECT a.pid, coalesce(host(a.client_addr), 'local socket'), a.backend_start"
        " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1::bigint::oid"
        " AND l.objid = (hashtext($2)::bigint & 4294967295)::oid AND l.objsubid = 2"
        " ORDER BY a.backend_start LIMIT 1",
        (lock, key),
    ).fetchone()
    if row is None:
        return "it just left"
    return f"server pid {row[0]}, connected from {row[1]} since {row[2]:%Y-%m-%d %H:%M:%S %Z}"


def migrate(conn: psycopg.Connection[Any], schema: str) -> int:
    """Create the schema if needed and apply pending migrations, in one transaction under an
    advisory lock; return the schema version. A newer schema refuses this crawld."""
    steps = shipped("postgres")
    latest = steps[-1][0] if steps else 0
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", (LOCK_KEY_PREFIX + schema,))
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote_ident(schema)}")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS crawld_schema ("
            " id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL,"
            " updated_ms BIGINT NOT NULL)"
        )
        row = conn.execute("SELECT version FROM crawld_schema WHERE id = 1").fetchone()
        current = row[0] if row else 0
        if current > latest:
            raise StoreUnavailable(
                f"postgres: schema {schema} is at version {current}, newer than this crawld"
                f" ({latest}); run the crawld that wrote it, or a newer one"
            )
        for version, name, sql in steps:
            if version > current:
                log.info("applying migration", backend="postgres", schema=schema, migration=name)
                conn.execute(sql)
        conn.execute(
            "INSERT INTO crawld_schema(id, version, updated_ms) VALUES (1, $1, $2)"
            " ON CONFLICT (id) DO UPDATE SET version = excluded.version,"
            " updated_ms = excluded.updated_ms",
            (latest, time.time_ns() // 1_000_000),
        )
    return latest


def inspect(dsn: str, schema: str, *, timeout: float = 10.0) -> ServerInfo:
    """Connect and report what `check-config --secrets` shows (raises PgUnavailable)."""
    conn = connect(dsn, schema, timeout=timeout)
    try:
        version = conn.execute("SHOW server_version").fetchone()
        user = conn.execute("SELECT current_user").fetchone()
        exists = conn.execute(
            "SELECT has_schema_privilege($1, 'CREATE') FROM pg_namespace WHERE nspname = $1",
            (schema,),
        ).fetchone()
        if exists is None:
            can = conn.execute(
                "SELECT has_database_privilege(current_database(), 'CREATE')"
            ).fetchone()
            schema_version = None
            can_create = bool(can and can[0])
        else:
            can_create = bool(exists[0])
            table = conn.execute(
                "SELECT to_regclass($1) IS NOT NULL", (f"{_quote_ident(schema)}.crawld_schema",)
            ).fetchone()
            schema_version = 0
            if table and table[0]:
                row = conn.execute("SELECT version FROM crawld_schema WHERE id = 1").fetchone()
                schema_version = int(row[0]) if row else 0
        steps = shipped("postgres")
        return ServerInfo(
            server_version=str(version[0]) if version else "?",
            schema=schema,
            schema_version=schema_version,
            latest=steps[-1][0] if steps else 0,
            can_create=can_create,
            user=str(user[0]) if user else "?",
            host=describe_dsn(dsn),
        )
    finally:
        conn.close()
