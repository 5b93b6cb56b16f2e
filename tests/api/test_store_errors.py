"""Storage faults are visible at the HTTP edge (issue 7, finding 6): a full disk is 507, other
storage errors 503, never 500; /healthz says degraded while the store cannot write and /status
says why."""

from __future__ import annotations

from typing import Any

import apsw
import pytest

from daemon.app import Daemon
from tests.api.conftest import StartDaemon, client, queue_rows, queue_size


def fail_writes(daemon: Daemon, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    assert daemon.store is not None

    async def write(fn: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(daemon.store, "write", write)


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_consume_on_a_full_disk_is_507(
    method: str, start_daemon: StartDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = await start_daemon()
    await queue_rows(daemon, 3)
    fail_writes(daemon, monkeypatch, apsw.FullError("database or disk is full"))
    async with client(daemon) as c:
        r = await c.request(method, "/consume", params={"count": 2})
        assert r.status_code == 507
        assert r.json() == {
            "error": "storage full: the database cannot take writes",
            "detail": "database or disk is full",
        }
    monkeypatch.undo()
    assert await queue_size(daemon) == 3


@pytest.mark.parametrize(
    "error",
    [apsw.IOError("disk I/O error"), apsw.ReadOnlyError("readonly"), apsw.CorruptError("x")],
)
async def test_other_storage_errors_are_503(
    error: Exception, start_daemon: StartDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = await start_daemon()
    fail_writes(daemon, monkeypatch, error)
    async with client(daemon) as c:
        r = await c.post("/consume")
        assert r.status_code == 503
        assert r.json()["error"] == "storage unavailable"
        assert r.json()["detail"].startswith(type(error).__name__)


async def test_healthz_is_degraded_while_the_store_cannot_write(
    start_daemon: StartDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = await start_daemon()
    assert daemon.store is not None

    def disk_full(conn: apsw.Connection) -> None:
        raise apsw.FullError("database or disk is full")

    # Every transaction fails while the disk is "full", the daemon's own background writes too
    # (one that committed would rightly report the store writable again).
    real_write = daemon.store.write

    async def write(fn: Any, **kwargs: Any) -> Any:
        return await real_write(disk_full)

    monkeypatch.setattr(daemon.store, "write", write)
    with pytest.raises(apsw.FullError):
        await daemon.store.write(disk_full)
    async with client(daemon) as c:
        health = await c.get("/healthz")
        assert health.status_code == 503
        body = health.json()
        assert body["status"] == "degraded"
        assert body["reason"] == "FullError: database or disk is full"
        assert isinstance(body["since_ms"], int)
        store = (await c.get("/status")).json()["store"]
        assert store["writable"] is False
        assert store["reason"] == body["reason"] and store["since_ms"] == body["since_ms"]

        monkeypatch.undo()
        await daemon.store.write(lambda conn: conn.execute("select 1"))
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        store = (await c.get("/status")).json()["store"]
        assert store["writable"] is True and "reason" not in store
