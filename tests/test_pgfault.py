"""The fault harness itself: a cut refuses connections until resumed, a restart loses every
connection and the data survives it."""

from __future__ import annotations

import psycopg
import pytest
import trio

from tests.pgfault import FaultyPg

pytestmark = [pytest.mark.postgres]


def _count(dsn: str) -> int:
    with psycopg.connect(dsn, connect_timeout=2) as conn:
        row = conn.execute("SELECT count(*) FROM t").fetchone()
        assert row is not None
        return int(row[0])


async def test_cut_refuses_until_resumed_and_restart_keeps_data(faulty_pg: FaultyPg) -> None:
    def create() -> None:
        with psycopg.connect(faulty_pg.dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute("CREATE TABLE t (x int)")
            conn.execute("INSERT INTO t VALUES (1)")

    # The proxy runs on this trio loop: every blocking client call goes to a thread.
    await trio.to_thread.run_sync(create)
    held = await trio.to_thread.run_sync(lambda: psycopg.connect(faulty_pg.dsn, autocommit=True))
    faulty_pg.cut()
    with pytest.raises(psycopg.OperationalError):
        await trio.to_thread.run_sync(_count, faulty_pg.dsn)
    with pytest.raises(psycopg.OperationalError):
        await trio.to_thread.run_sync(lambda: held.execute("SELECT 1"))
    assert await trio.to_thread.run_sync(_count, faulty_pg.direct_dsn) == 1  # the server is up
    faulty_pg.resume()
    assert await trio.to_thread.run_sync(_count, faulty_pg.dsn) == 1

    survivor = await trio.to_thread.run_sync(lambda: psycopg.connect(faulty_pg.dsn))
    await faulty_pg.restart()
    with pytest.raises(psycopg.OperationalError):
        await trio.to_thread.run_sync(lambda: survivor.execute("SELECT 1"))
    assert await trio.to_thread.run_sync(_count, faulty_pg.dsn) == 1
    held.close()
    survivor.close()
