"""PostgreSQL faults for process tests: a private server the test may stop, crash and restart,
behind a TCP proxy the test may cut.

The shared server (CRAWLD_TEST_PG_DSN) serves every other test, so a test that restarts
PostgreSQL gets a server of its own: `initdb` in a temporary folder (owned by the `postgres`
user when the tests run as root, since PostgreSQL refuses to run as root), on an ephemeral port,
with fsync off. Instances reach it only through `TcpProxy`, so a cut looks to them like a
network failure (every connection dies at once, new ones are refused) while the server keeps
running; `restart()` is the other fault, a crash of the server itself.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from tests.cluster.harness import Instances, free_port
from tests.tcp_proxy import TcpProxy


def pg_bin() -> Path | None:
    """The folder of the newest installed PostgreSQL server binaries (None: not installed)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    return Path(found[-1]).parent if found else None


def _version(path: str) -> int:
    try:
        return int(Path(path).parent.parent.name)
    except ValueError:
        return 0


class PgServer:
    """A private PostgreSQL server on 127.0.0.1:`port` (trust auth, user `postgres`)."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="crawld-pg-"))
        self.data = self.root / "data"
        self.logfile = self.root / "server.log"
        self.port = free_port()
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            shutil.chown(self.root, "postgres", "postgres")

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 60) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, timeout=timeout, cwd=self.root)
        if result.returncode != 0:
            raise RuntimeError(
                f"{args[0]} failed ({result.returncode}): "
                f"{result.stderr.decode(errors='replace')[-2000:]}\n{self.log()}"
            )

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync", "--no-instructions")  # fmt: skip

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off "
            "-c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-o", options,
                  "-w", "-t", "60", "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: `fast` (clients disconnected, a clean shutdown) or `immediate` (a
        crash: recovery runs at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "immediate") -> None:
        self.stop(mode)
        self.start()

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class FaultyPg:
    """A private server, the proxy in front of it, and the schema a test's instances use."""

    server: PgServer
    proxy: TcpProxy
    schema: str

    @property
    def dsn(self) -> str:
        """The DSN through the proxy: what crawld instances get."""
        return f"postgresql://postgres@127.0.0.1:{self.proxy.port}/postgres"

    @property
    def direct_dsn(self) -> str:
        """The DSN straight to the server: what the test reads with, whatever the proxy does."""
        return self.server.dsn

    def cut(self) -> None:
        """Every connection through the proxy dies at once; new ones are refused."""
        self.proxy.cut()

    def resume(self) -> None:
        self.proxy.resume()

    async def outage(self, seconds: float) -> None:
        """Cut the proxy for `seconds` (real time), then let connections through again."""
        self.cut()
        try:
            await trio.sleep(seconds)
        finally:
            self.resume()

    async def restart(self, mode: str = "immediate", down_for: float = 0.0) -> None:
        """Crash (or stop) the server, keep it down `down_for` seconds, start it again."""
        await trio.to_thread.run_sync(self.server.stop, mode)
        if down_for:
            await trio.sleep(down_for)
        await trio.to_thread.run_sync(self.server.start)


def _missing() -> str | None:
    if pg_bin() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) are not installed"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: cannot start a private PostgreSQL server"
    return None


@pytest.fixture
def pg_server() -> Iterator[PgServer]:
    """A fresh private PostgreSQL server, destroyed after the test (skip, or fail under
    CI=true, when PostgreSQL's server binaries are not installed)."""
    problem = _missing()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    bindir = pg_bin()
    assert bindir is not None
    server = PgServer(bindir)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture
async def faulty_pg(pg_server: PgServer, nursery: trio.Nursery) -> FaultyPg:
    """A private server behind a cuttable proxy, and a schema name for the test's instances."""
    proxy = TcpProxy("127.0.0.1", pg_server.port)
    await nursery.start(proxy.run)
    return FaultyPg(pg_server, proxy, f"crawld_fault_{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def faulty_instances(tmp_path: Path, faulty_pg: FaultyPg) -> AsyncIterator[Instances]:
    """crawld processes (tests/cluster/harness.py `Instances`) on `faulty_pg`'s schema, reaching
    the server through its proxy; every one killed at the end and the end of its log printed."""
    cluster = Instances(tmp_path / "instances", faulty_pg.dsn, faulty_pg.schema)
    try:
        yield cluster
    finally:
        await cluster.aclose()
        for key, instance in cluster.by_key.items():
            tail = instance.stderr().splitlines()[-40:]
            print(f"--- instance {key}, the end of its log:", *tail, sep="\n")
        print("--- private PostgreSQL server log:", faulty_pg.server.log(), sep="\n")
