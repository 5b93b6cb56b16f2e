from __future__ import annotations

import functools
import os
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from daemon import settings as config
from daemon.app import Daemon, run_daemon
from daemon.outbox import Outbox
from daemon.store import Store, open_store
from daemon.store.postgres import PostgresBackend
from daemon.systemd import Notifier
from tests import slowest
from tests.pgschemas import SchemaPool

if TYPE_CHECKING:
    from tests.cluster.harness import Instances


def unlabelled(metrics: str) -> str:
    """/metrics text without the `instance` label a daemon on PostgreSQL (a cluster member, if
    alone) puts on every sample, so tests read the same lines on both backends."""
    return re.sub(r'instance="[^"]*",?', "", metrics).replace("{}", "")


async def serve_daemon(nursery: trio.Nursery, path: Path) -> Daemon:
    """Load `path` and run the daemon in `nursery` (no systemd notifications); returns it once
    it serves."""
    cfg = config.load(path)
    daemon: Daemon = await nursery.start(
        functools.partial(run_daemon, cfg, notifier=Notifier(None))
    )
    return daemon


PG_DSN = os.environ.get("CRAWLD_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
"""The PostgreSQL server the tests use (scripts/test makes sure one is up)."""


@functools.cache
def pg_problem() -> str | None:
    """Why PostgreSQL cannot be used (None: it can)."""
    import psycopg

    try:
        psycopg.connect(PG_DSN, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"PostgreSQL at CRAWLD_TEST_PG_DSN is not reachable: {exc}".strip()
    return None


def require_pg() -> str:
    """PG_DSN, or skip (fail under CI=true) when there is no server."""
    problem = pg_problem()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    return PG_DSN


CLUSTER_MODULES = {
    "tests/cluster/test_membership_process.py",
    "tests/collector/test_cluster_collector.py",
    "tests/crawlapi/test_cluster_process.py",
    "tests/crawlapi/test_extract_cluster.py",
    "tests/crawlapi/test_lease_faults.py",
    "tests/crawlapi/test_monitor_faults.py",
    "tests/integration/test_collector_cluster.py",
    "tests/integration/test_collector_job_survives.py",
    "tests/jobs/test_cluster_jobs.py",
    "tests/jobs/test_cluster_process.py",
    "tests/jobs/test_fault_process.py",
    "tests/test_pgfault.py",
    "tests/tracker/test_tracker_cluster_process.py",
    "tests/tracker/test_tracker_cluster_store.py",
}
"""Tests that run several crawld processes (or stores) on one PostgreSQL and time leases,
pauses and failovers against each other."""

TIMING_MODULES = {
    "tests/integration/test_broker.py",
}
"""Tests that time a real broker's own work (TTL expiry, requeues after a cancelled call,
forced closes) in fractions of a second; beside other tests' load they would time the load.
They run with CLUSTER_MODULES, after the rest."""

ALONE = CLUSTER_MODULES | TIMING_MODULES
"""The modules of the phase after the rest (CRAWLD_TEST_CLUSTER=only)."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With CRAWLD_TEST_CLUSTER=only, modules (and folders) holding none of those tests are not
    even imported: each of the phase's workers would otherwise collect the whole suite."""
    if os.environ.get("CRAWLD_TEST_CLUSTER") != "only":
        return None
    try:
        rel = collection_path.relative_to(config.rootpath).as_posix()
    except ValueError:
        return None
    if collection_path.is_dir():
        return None if any(m.startswith(rel + "/") for m in ALONE) or rel == "." else True
    if collection_path.name.startswith("test_") and collection_path.suffix == ".py":
        return None if rel in ALONE else True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """CRAWLD_TEST_CLUSTER=skip leaves out the tests of CLUSTER_MODULES and TIMING_MODULES,
    =only runs just them. `scripts/test` runs the rest in pytest-xdist workers, then these after
    them in workers of their own: a test of what happens when a lease runs out, a member
    pauses or the owner dies times instances against each other (and a broker test the broker),
    and beside the CPU-bound rest on a 2-core machine it would measure the load."""
    choice = os.environ.get("CRAWLD_TEST_CLUSTER")
    items[:] = slowest.deal(items, [item.nodeid for item in items], slowest.workers())
    if choice not in ("skip", "only"):
        return
    root = Path(str(config.rootpath))
    kept, left = [], []
    for item in items:
        cluster = Path(str(item.path)).relative_to(root).as_posix() in ALONE
        (kept if cluster == (choice == "only") else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


@pytest.fixture
def pg_schema() -> Iterator[tuple[str, str]]:
    """(dsn, schema): a schema of its own for one test, dropped after it."""
    import psycopg

    dsn = require_pg()
    schema = f"crawld_test_{uuid.uuid4().hex[:12]}"
    try:
        yield dsn, schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


_POOLS: dict[str, SchemaPool] = {}


@pytest.fixture
def pg_clean_schema(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(dsn, schema): a migrated schema of its own for one test, holding only what the
    migrations put there, from a pool (tests/pgschemas.py): for a test that opens crawld on
    it; one that tests migrations or schemas themselves takes `pg_schema`. A test that takes
    `pg_schema` too gets that one here (both name the schema its processes run on)."""
    if "pg_schema" in request.fixturenames:
        yield request.getfixturevalue("pg_schema")
        return
    dsn = require_pg()
    pool = _POOLS.setdefault(dsn, SchemaPool(dsn))
    schema = pool.take()
    try:
        yield dsn, schema
    finally:
        pool.give_back(schema)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for pool in _POOLS.values():
        pool.close()


def pg_backend(dsn: str, schema: str, **kwargs: Any) -> PostgresBackend:
    return PostgresBackend(dsn, schema=schema, pool_size=3, **kwargs)


@dataclass(frozen=True)
class Deployment:
    """The store a crawld process under test runs on: `toml` goes into its config file (a
    `[store]` section, or nothing for the SQLite default) and `env` into its environment."""

    kind: str
    toml: str = ""
    env: dict[str, str] = field(default_factory=dict)
    schema: str | None = None

    def target(self, state_dir: Path) -> Path | PostgresBackend:
        """What open_store opens to read what the process left behind."""
        if self.schema is None:
            return state_dir / "crawld.db"
        return pg_backend(self.env["CRAWLD_TEST_STORE_DSN"], self.schema)


@pytest.fixture(params=["sqlite", "postgres"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    """Each kill -9 test runs once per backend."""
    if request.param == "sqlite":
        return Deployment("sqlite")
    dsn, schema = request.getfixturevalue("pg_clean_schema")
    toml = f'[store]\nkind = "postgres"\ndsn_env = "CRAWLD_TEST_STORE_DSN"\nschema = "{schema}"\n'
    return Deployment("postgres", toml, {"CRAWLD_TEST_STORE_DSN": dsn}, schema)


@pytest.fixture(params=["sqlite", "postgres"])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> Path | PostgresBackend:
    """What open_store opens, on each backend: a SQLite path, or a PostgreSQL backend on a
    schema of the test's own."""
    if request.param == "postgres":
        return pg_backend(*request.getfixturevalue("pg_clean_schema"))
    return tmp_path / "crawld.db"


@pytest.fixture
async def store(store_target: Path | PostgresBackend) -> AsyncIterator[Store]:
    """The store on each backend (every test using it runs on both)."""
    async with open_store(store_target) as opened:
        yield opened


@pytest.fixture
async def two_stores(
    pg_clean_schema: tuple[str, str],
) -> AsyncIterator[tuple[Store, Store]]:
    """Two processes' stores on one PostgreSQL schema (two cluster members)."""
    schema = pg_clean_schema
    async with open_store(pg_backend(*schema)) as a, open_store(pg_backend(*schema)) as b:
        yield a, b


@pytest.fixture
async def outbox(store: Store) -> Outbox:
    return Outbox(store)


class NotifySocket:
    """An abstract AF_UNIX datagram socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self) -> None:
        import os
        import socket

        self.address = f"@crawld-test-{os.getpid()}-{id(self)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(b"\0" + self.address[1:].encode())

    def receive(self, timeout: float = 30.0) -> dict[str, str]:
        """The next datagram as a dict of fields (blocking, with a real-time timeout)."""
        self.sock.settimeout(timeout)
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.split("\n") if line)

    async def areceive(self, timeout: float = 30.0) -> dict[str, str]:
        import trio

        return await trio.to_thread.run_sync(self.receive, timeout)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket() -> Iterator[NotifySocket]:
    sock = NotifySocket()
    try:
        yield sock
    finally:
        sock.close()


@pytest.fixture(autouse=True)
def _daemons_on_postgres(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """CRAWLD_TEST_STORE=postgres: every in-process daemon whose config names the SQLite default
    runs on a PostgreSQL schema of the test's own instead (scripts/test runs the API and crawl
    tests so, next to the whole suite on SQLite)."""
    if os.environ.get("CRAWLD_TEST_STORE") != "postgres":
        return
    import daemon.app
    from daemon.store import backend_for

    def on_postgres(cfg: config.Config) -> Any:
        if cfg.store.kind != "sqlite":
            return backend_for(cfg)
        return pg_backend(*request.getfixturevalue("pg_clean_schema"))

    monkeypatch.setattr(daemon.app, "backend_for", on_postgres)


@pytest.fixture
async def instances(tmp_path: Path, pg_clean_schema: tuple[str, str]) -> AsyncIterator[Instances]:
    """crawld processes on one PostgreSQL schema (tests/cluster/harness.py `Instances`), every
    one killed at the end, whatever happened; the end of each one's log is printed (pytest shows
    it when the test failed)."""
    from tests.cluster.harness import Instances

    cluster = Instances(tmp_path / "instances", *pg_clean_schema)
    try:
        yield cluster
    finally:
        await cluster.aclose()
        for key, instance in cluster.by_key.items():
            tail = instance.stderr().splitlines()[-40:]
            print(f"--- instance {key}, the end of its log:", *tail, sep="\n")


# A private PostgreSQL server behind a cuttable proxy, for tests that cut or restart the database.
from tests.pgfault import faulty_instances, faulty_pg, pg_server  # noqa: E402, F401
