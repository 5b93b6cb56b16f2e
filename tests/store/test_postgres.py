"""What only the PostgreSQL backend does: migrations under an advisory lock, schema versions,
start-up errors, and riding out a lost connection or a restarted server with nothing lost."""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from daemon.store import DB_ERRORS, Store, StoreUnavailable, backend_for, one, open_store
from daemon.store.migrations import shipped
from daemon.store.postgres import PostgresBackend, connect, inspect, migrate
from tests.conftest import pg_backend, require_pg
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.postgres
LATEST = shipped("postgres")[-1][0]


def test_instances_starting_together_migrate_once(pg_schema: tuple[str, str]) -> None:
    dsn, schema = pg_schema

    def start() -> int:
        conn = connect(dsn, schema)
        try:
            return migrate(conn, schema)
        finally:
            conn.close()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        versions = list(pool.map(lambda _: start(), range(4)))
    assert versions == [LATEST] * 4
    with psycopg.connect(dsn) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchone()
        assert tables is not None and tables[0] > 20


async def test_a_newer_schema_refuses_this_crawld(pg_schema: tuple[str, str]) -> None:
    dsn, schema = pg_schema
    async with open_store(pg_backend(dsn, schema)) as store:
        assert store.schema_version == LATEST
        await store.write(lambda c: c.execute("UPDATE crawld_schema SET version = 999"))
    with pytest.raises(StoreUnavailable, match=r"postgres: schema .* version 999, newer"):
        async with open_store(pg_backend(dsn, schema)):
            pass


def test_unreachable_server_names_host_and_reason() -> None:
    with pytest.raises(StoreUnavailable, match=r"postgres: cannot connect to 127\.0\.0\.1:9/x"):
        PostgresBackend("postgresql://u@127.0.0.1:9/x", connect_timeout=1).connect()


def test_inspect_reports_server_and_schema(pg_schema: tuple[str, str]) -> None:
    dsn, schema = pg_schema
    info = inspect(dsn, schema)
    assert info.schema_version is None and info.can_create
    assert info.server_version and info.latest == LATEST
    conn = connect(dsn, schema)
    migrate(conn, schema)
    conn.close()
    assert inspect(dsn, schema).schema_version == LATEST


def test_values_come_back_as_sqlite_gives_them(pg_schema: tuple[str, str]) -> None:
    dsn, schema = pg_schema
    backend = pg_backend(dsn, schema)
    conn = backend.connect()
    try:
        migrate(conn.raw, schema)
        row = one(conn, "SELECT ? + ?, sum(x), avg(x), 7 / 2, ?, ? FROM (VALUES (1), (2)) v(x)",
                  (30000, 30000, True, "ab\\nc"))  # fmt: skip
        assert row == (60000, 3, 1.5, 3, 1, "ab\\nc")
        assert type(row[1]) is int and type(row[2]) is float
    finally:
        conn.raw.close()


def _dsn_via(port: int) -> str:
    return make_conninfo(require_pg(), host="127.0.0.1", port=str(port))


async def _wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await trio.sleep(0.02)


async def _write_through_an_outage(
    store: Store, outage: Any, acked: list[int], total: int = 300, break_at: int = 100
) -> None:
    """Insert 0..total-1, one write each, appending each acknowledged value to `acked`;
    `outage()` runs once `break_at` are acknowledged. A write whose COMMIT answer was lost
    raises: it is written again (idempotently), as areas do."""
    await store.write(
        lambda c: c.execute("CREATE TABLE IF NOT EXISTS t(x BIGINT PRIMARY KEY, at_ms BIGINT)")
    )

    async def writer(nursery: trio.Nursery) -> None:
        for i in range(total):
            while True:
                try:
                    await store.write(
                        lambda c, i=i: c.execute(
                            "INSERT INTO t VALUES (?, ?) ON CONFLICT DO NOTHING", (i, 0)
                        )
                    )
                    break
                except DB_ERRORS:
                    await trio.sleep(0.05)
            acked.append(i)
            if len(acked) == break_at:
                nursery.start_soon(outage)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer, nursery)


async def test_a_cut_connection_degrades_then_recovers_with_nothing_lost(
    pg_schema: tuple[str, str],
) -> None:
    dsn, schema = pg_schema
    target = conninfo_to_dict(dsn)
    proxy = TcpProxy(str(target.get("host") or "127.0.0.1"), int(target.get("port") or 5432))
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        backend = PostgresBackend(_dsn_via(proxy.port), schema=schema, pool_size=3)
        backend.probe_every = 0.1
        seen: dict[str, Any] = {}
        acked: list[int] = []
        async with open_store(backend) as store:

            async def outage() -> None:
                proxy.cut()
                await _wait_for(lambda: not store.health().writable)
                seen["health"] = store.health()
                before = len(acked)
                await trio.sleep(0.5)
                seen["acked during the outage"] = len(acked) - before
                proxy.resume()

            await _write_through_an_outage(store, outage, acked)
            await _wait_for(lambda: store.health().writable)
            rows = await store.read(lambda c: [r[0] for r in c.execute("SELECT x FROM t")])
        nursery.cancel_scope.cancel()
    assert sorted(rows) == list(range(300)) == sorted(acked)
    assert seen["health"].writable is False and "OperationalError" in seen["health"].reason
    assert seen["acked during the outage"] <= 1  # at most the write in flight when it was cut
    assert proxy.connections > 3  # the writer and the readers reconnected


def _pg_bindir() -> Path:
    out = shutil.which("pg_config")
    if out:
        found = subprocess.run([out, "--bindir"], capture_output=True, text=True).stdout.strip()
        if (Path(found) / "initdb").exists():
            return Path(found)
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    message = "initdb is not installed (apt-get install postgresql)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


class PrivateServer:
    """A PostgreSQL server of the test's own (initdb in tmp), so it can be restarted."""

    def __init__(self, root: Path) -> None:
        self.bindir = _pg_bindir()
        self.data = root / "pgdata"
        self.port = _free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # the server refuses to run as root
            self.as_user = ["runuser", "-u", "postgres", "--"]
            root.chmod(0o777)
        self.data.mkdir()
        if self.as_user:
            shutil.chown(self.data, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8")

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bindir / tool), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )

    def pg_ctl(self, action: str) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.data.parent / "server.log")
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "-m", "fast", action
        )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    require_pg()
    # Not under tmp_path: pytest's folders are private to root, and the server runs as postgres.
    root = Path(tempfile.mkdtemp(prefix="crawld-test-pg-"))
    try:
        server = PrivateServer(root)
        server.pg_ctl("start")
        try:
            yield server
        finally:
            subprocess.run(
                [*server.as_user, str(server.bindir / "pg_ctl"), "-D", str(server.data), "-m",
                 "immediate", "stop"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=60,
            )  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_a_restarted_server_loses_nothing(private_server: PrivateServer) -> None:
    backend = PostgresBackend(private_server.dsn, schema="crawld", pool_size=3)
    backend.probe_every = 0.1
    async with open_store(backend) as store:

        async def outage() -> None:
            await trio.to_thread.run_sync(private_server.pg_ctl, "restart")

        acked: list[int] = []
        await _write_through_an_outage(store, outage, acked, total=400, break_at=100)
        rows = await store.read(lambda c: [r[0] for r in c.execute("SELECT x FROM t")])
        await _wait_for(lambda: store.health().writable)
    assert sorted(rows) == list(range(400)) == sorted(acked)


def test_crawld_run_exits_naming_the_unreachable_server(tmp_path: Path) -> None:
    cfg = tmp_path / "crawld.toml"
    cfg.write_text(
        '[daemon]\nstate_dir = "state"\n[http]\nbind = "127.0.0.1:0"\n'
        '[store]\nkind = "postgres"\ndsn_env = "CRAWLD_TEST_DSN"\nconnect_timeout = "1s"\n'
    )
    env = dict(os.environ, CRAWLD_TEST_DSN="postgresql://crawld:secret@127.0.0.1:9/crawld")
    proc = subprocess.run(
        [sys.executable, "-m", "daemon", "run", "--config", str(cfg)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "postgres: cannot connect to 127.0.0.1:9/crawld" in proc.stderr
    assert "secret" not in proc.stderr + proc.stdout


async def test_two_writers_taking_from_one_queue_never_share_a_message(
    pg_schema: tuple[str, str],
) -> None:
    """Two crawld processes on one schema (two writer connections): every message is taken
    once, none is lost."""
    from daemon.outbox import NewItem, Outbox

    dsn, schema = pg_schema
    async with open_store(pg_backend(dsn, schema)) as a, open_store(pg_backend(dsn, schema)) as b:
        keys = [f"m{i}" for i in range(2000)]
        for start in range(0, len(keys), 500):
            await Outbox(a).append(
                "queue:q", [NewItem(key=k, body=k.encode()) for k in keys[start : start + 500]]
            )
        taken: list[str] = []

        async def consumer(store: Store) -> None:
            outbox = Outbox(store)
            while True:
                got, _ = await outbox.take("queue:q", 7)
                if not got:
                    return
                taken.extend(item.key for item in got)

        async with trio.open_nursery() as nursery:
            for store in (a, b, a, b):
                nursery.start_soon(consumer, store)
    assert len(taken) == len(set(taken)) == 2000


async def test_healthz_is_degraded_while_the_server_is_cut_off_then_ok(
    pg_schema: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    from tests.conftest import serve_daemon

    dsn, schema = pg_schema
    target = conninfo_to_dict(dsn)
    proxy = TcpProxy(str(target.get("host") or "127.0.0.1"), int(target.get("port") or 5432))
    monkeypatch.setattr(PostgresBackend, "probe_every", 0.1)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        monkeypatch.setenv("CRAWLD_TEST_HEALTH_DSN", _dsn_via(proxy.port))
        path = tmp_path / "crawld.toml"
        path.write_text(
            '[daemon]\nstate_dir = "state"\n[crawl.browser]\nenabled = false\n[http]\nbind = "127.0.0.1:0"\n[store]\n'
            f'kind = "postgres"\ndsn_env = "CRAWLD_TEST_HEALTH_DSN"\nschema = "{schema}"\n'
        )
        daemon = await serve_daemon(nursery, path)
        assert daemon.http_address is not None
        base = "http://{}:{}".format(*daemon.http_address)
        async with httpx.AsyncClient(base_url=base, trust_env=False) as http:
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            status = (await http.get("/status")).json()["store"]
            assert status["backend"] == "postgres" and f"schema {schema}" in status["path"]
            assert "@" not in status["path"]
            proxy.cut()
            with trio.fail_after(20):
                while (answer := await http.get("/healthz")).status_code != 503:
                    await trio.sleep(0.05)
            body = answer.json()
            assert body["status"] == "degraded" and body["backend"] == "postgres"
            assert "OperationalError" in body["reason"]
            proxy.resume()
            with trio.fail_after(30):
                while (await http.get("/healthz")).status_code != 200:
                    await trio.sleep(0.05)
        daemon.request_stop()
        await daemon.stopped.wait()
        nursery.cancel_scope.cancel()


def test_check_config_secrets_reports_the_server(
    pg_schema: tuple[str, str], tmp_path: Path
) -> None:
    dsn, schema = pg_schema
    path = tmp_path / "crawld.toml"
    path.write_text(
        f'[store]\nkind = "postgres"\ndsn_env = "TEST_CHECK_DSN"\nschema = "{schema}"\n'
    )

    def check(value: str | None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "TEST_CHECK_DSN"}
        if value is not None:
            env["TEST_CHECK_DSN"] = value
        return subprocess.run(
            [sys.executable, "-m", "daemon", "check-config", "--secrets", str(path)],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    ok = check(dsn)
    assert ok.returncode == 0, ok.stderr
    assert f"schema {schema} does not exist yet" in ok.stdout
    assert re.search(r"store: postgres \d+", ok.stdout), ok.stdout
    unset = check(None)
    assert unset.returncode == 2 and "TEST_CHECK_DSN (named at `$.store.dsn_env`)" in unset.stderr
    down = check("postgresql://x:hunter2@127.0.0.1:9/db?connect_timeout=1")
    assert down.returncode == 2 and "postgres: cannot connect to 127.0.0.1:9/db" in down.stderr
    assert "hunter2" not in down.stderr


async def test_a_second_instance_of_one_name_on_a_schema_refuses_naming_the_first(
    pg_schema: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from daemon import settings as config
    from daemon.app import run_daemon
    from daemon.systemd import Notifier
    from tests.conftest import serve_daemon

    dsn, schema = pg_schema
    monkeypatch.setenv("CRAWLD_TEST_ONE_DSN", dsn)
    path = tmp_path / "crawld.toml"
    path.write_text(
        '[daemon]\nstate_dir = "state"\n[crawl.browser]\nenabled = false\n[http]\nbind = "127.0.0.1:0"\n[store]\n'
        f'kind = "postgres"\ndsn_env = "CRAWLD_TEST_ONE_DSN"\nschema = "{schema}"\n'
    )
    async with trio.open_nursery() as nursery:
        first = await serve_daemon(nursery, path)
        with pytest.raises(
            StoreUnavailable,
            match=rf"instance name '.+' is in use on schema {schema} .* by another live crawld"
            r" \(server pid \d+",
        ):
            await run_daemon(config.load(path), notifier=Notifier(None))
        first.request_stop()
        await first.stopped.wait()
    # gone with its holder: the next one starts
    async with trio.open_nursery() as nursery:
        again = await serve_daemon(nursery, path)
        again.request_stop()
        await again.stopped.wait()


async def test_one_video_history_in_one_transaction_is_linear(pg_schema: tuple[str, str]) -> None:
    """tracker_latest is kept once per statement (migration 0009): a row trigger updated the
    video's row once per snapshot, which PostgreSQL makes quadratic in one transaction (~30 s
    for these 60,000 rows, 0.5 s now)."""
    rows = [(1, 1000 + i, i, 0, 0, 0, 0, 0, 0) for i in range(60_000)]
    rows += [(2, 5000, 7, 0, 0, 0, 0, 0, 0), (2, 4000, 9, 0, 0, 0, 0, 0, 0)]

    def write(conn: Any) -> None:
        conn.executemany(
            "INSERT INTO tracker_snapshots(aid, at_ms, views, danmakus, replies, likes, coins,"
            " shares, favorites) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.execute(
            "INSERT INTO tracker_snapshots(aid, at_ms, views, danmakus, replies, likes, coins,"
            " shares, favorites) VALUES (2, 3000, 1, 0, 0, 0, 0, 0, 0)"
        )

    async with open_store(pg_backend(*pg_schema)) as store:
        started = time.monotonic()
        await store.write(write)
        assert time.monotonic() - started < 10
        latest = await store.read(
            lambda c: c.execute("SELECT aid, at_ms, views FROM tracker_latest ORDER BY aid")
            .fetchall()
        )  # fmt: skip
    assert [tuple(r) for r in latest] == [(1, 60_999, 59_999), (2, 5000, 7)]


async def test_the_writer_ends_a_transaction_left_idle_by_a_paused_process(
    pg_schema: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster member paused mid-transaction would hold its row locks, and every other member's
    writer with them: the server ends such a transaction after a third of the lease."""
    from daemon import settings as config

    dsn, schema = pg_schema
    monkeypatch.setenv("CRAWLD_TEST_IDLE_DSN", dsn)
    cfg = config.decode(
        f'[store]\nkind = "postgres"\ndsn_env = "CRAWLD_TEST_IDLE_DSN"\nschema = "{schema}"\n'
        '[cluster]\nlease = "3s"\n'
    )
    backend = backend_for(cfg)
    conn = backend.connect()
    try:
        (value,) = conn.raw.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        assert value == "1s"
    finally:
        conn.raw.close()


def _paused_mid_exchange(dsn: str, schema: str, name: str, key: str) -> psycopg.Connection[Any]:
    """A session whose client sent `BEGIN` and an insert of tracker_limiter row ('r1', `key`)
    but not the Sync that ends the exchange, as a process paused between two sends leaves it:
    `active`, waiting on its client, its idle-in-transaction timeout (300 ms) never armed."""
    conn = psycopg.connect(dsn, autocommit=True, application_name=name)
    conn.execute("SELECT set_config('search_path', %s, false)", (schema,))
    conn.execute("SET idle_in_transaction_session_timeout = '300ms'")
    pg = conn.pgconn
    pg.enter_pipeline_mode()
    pg.send_query_params(b"BEGIN", None)
    insert = f"INSERT INTO tracker_limiter VALUES ('r1', '{key}', 1)"
    pg.send_query_params(insert.encode(), None)
    pg.send_flush_request()
    while pg.flush():
        pass
    # both results back: the insert ran and holds its row lock (the server may otherwise still
    # be on its way there when the caller's own write of the row starts)
    for _ in ("BEGIN", "INSERT"):
        result = pg.get_result()
        assert result is not None and result.status == psycopg.pq.ExecStatus.COMMAND_OK
        assert pg.get_result() is None
    return conn


async def _session(dsn: str, name: str) -> tuple[Any, ...] | None:
    def read() -> tuple[Any, ...] | None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute(
                "SELECT state, wait_event, pg_blocking_pids(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (name,),
            ).fetchone()

    return await trio.to_thread.run_sync(read)


async def _pids(dsn: str) -> set[int]:
    def read() -> set[int]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return {pid for (pid,) in conn.execute("SELECT pid FROM pg_stat_activity")}

    return await trio.to_thread.run_sync(read)


async def test_a_writer_held_up_by_a_session_paused_mid_exchange_ends_it(
    pg_clean_schema: tuple[str, str],
) -> None:
    """A crawld process paused between a statement and its Sync holds its row locks where no
    server timeout applies, and every writer that needs them waits: a writer held up longer
    than its idle timeout ends such a session of crawld's on the same schema, never one of
    another program."""
    from daemon.store.postgres import application_name

    dsn, schema = pg_clean_schema
    upsert = (
        "INSERT INTO tracker_limiter VALUES ('r1', ?, 5)"
        " ON CONFLICT (proxy, limit_key) DO UPDATE SET tat_ms = tracker_limiter.tat_ms + 5"
    )
    tat = "SELECT tat_ms FROM tracker_limiter WHERE limit_key = ?"
    async with open_store(pg_backend(dsn, schema, idle_in_transaction_ms=300)) as store:
        # another program's session: waited for, however long (here until it is closed)
        other = await trio.to_thread.run_sync(
            _paused_mid_exchange, dsn, schema, "someone else", "a"
        )
        done = trio.Event()

        async def write_a() -> None:
            await store.write(lambda c: c.execute(upsert, ("a",)))
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_a)
            with trio.fail_after(10):
                while not (found := await _session(dsn, "someone else")) or not found[0]:
                    await trio.sleep(0.05)
                while store.busy_since is None or time.monotonic() - store.busy_since < 1.5:
                    await trio.sleep(0.05)
            assert not done.is_set()
            assert (await _session(dsn, "someone else"))[:2] == ("active", "ClientRead")  # type: ignore[index]
            await trio.to_thread.run_sync(other.close)
        assert await store.read(lambda c: one(c, tat, ("a",))[0]) == 5

        # crawld's own kind: ended once the writer has waited 300 ms; its insert never commits
        paused = await trio.to_thread.run_sync(
            _paused_mid_exchange, dsn, schema, application_name(schema), "b"
        )
        try:
            with trio.fail_after(10):
                await store.write(lambda c: c.execute(upsert, ("b",)))
            assert await store.read(lambda c: one(c, tat, ("b",))[0]) == 5
            # the server process leaves pg_stat_activity once it has exited, shortly after
            # its transaction (and the lock) ended
            with trio.fail_after(10):
                while paused.info.backend_pid in await _pids(dsn):
                    await trio.sleep(0.05)
        finally:
            await trio.to_thread.run_sync(paused.close)
