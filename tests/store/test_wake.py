"""Wake-ups (daemon/store/wake.py): fired after the commit that sent them, never after a
rollback; across processes on PostgreSQL through LISTEN/NOTIFY, with the safety poll as the net
while the LISTEN connection is down. Real servers and real time: every wait is bounded by a
generous fail_after, never a timing threshold."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from daemon.outbox import NewItem, Outbox
from daemon.store import Store, open_store, wake
from daemon.store.postgres import PostgresBackend
from daemon.store.wake import Wakeups
from tests.conftest import pg_backend
from tests.tcp_proxy import TcpProxy

LONG = 3600.0
"""A safety poll that never comes within a test: what arrives, arrived through a wake-up."""


async def _until(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await trio.sleep(0.01)


class Boom(Exception):
    pass


def _notify_then(channel: str, key: str, fail: bool = False) -> Any:
    def tx(conn: Any) -> None:
        conn.execute("SELECT 1").fetchall()
        wake.notify(conn, channel, key)
        if fail:
            raise Boom

    return tx


# -- one process ---------------------------------------------------------------------------


async def test_a_committed_notify_fires_after_the_commit_and_a_failed_one_never(
    tmp_path: Path,
) -> None:
    async with open_store(tmp_path / "db") as store:
        assert store.wakeups.safety_s is None  # SQLite: one process, nothing to poll for
        ok = store.wakeups.event(wake.APPENDED, "ok")
        failed = store.wakeups.event(wake.APPENDED, "failed")
        with pytest.raises(Boom):
            await store.write(_notify_then(wake.APPENDED, "failed", fail=True))
        await store.write(_notify_then(wake.APPENDED, "ok"))
        assert ok.is_set()
        assert not failed.is_set()
        # A fired event is replaced: waiting again waits for the next wake-up.
        assert not store.wakeups.event(wake.APPENDED, "ok").is_set()


async def test_a_job_failing_in_a_group_keeps_the_others_wake_ups(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db") as store:
        events = {k: store.wakeups.event(wake.FRONTIER, k) for k in ("a", "b", "c")}
        async with trio.open_nursery() as nursery:  # one scheduler pass: one group

            async def write(key: str, fail: bool) -> None:
                with contextlib.suppress(Boom):
                    await store.write(_notify_then(wake.FRONTIER, key, fail))

            for key in ("a", "b", "c"):
                nursery.start_soon(write, key, key == "b")
        assert store.stats.largest_group >= 2
        assert {k: e.is_set() for k, e in events.items()} == {"a": True, "b": False, "c": True}


def test_notify_outside_a_write_does_nothing() -> None:
    wake.notify(object(), wake.APPENDED, "s")  # no store write runs in this thread


async def test_a_lost_listen_connection_wakes_everybody_and_a_long_key_its_channel() -> None:
    wakeups = Wakeups(safety_s=LONG)
    wakeups.set_listening(True)
    a, b = wakeups.event(wake.APPENDED, "a"), wakeups.event(wake.ACKED, "b")
    wakeups.set_listening(False)
    assert a.is_set() and b.is_set()
    again = wakeups.event(wake.APPENDED, "a")
    wakeups.set_listening(True)  # back: whatever was sent meanwhile is gone, look again
    assert again.is_set() and wakeups.counters["reconnects"] == 1
    mine, other = wakeups.event(wake.REQUEST, "x" * 2000), wakeups.event(wake.ACKED, "b")
    wakeups.received(wake.encode(wake.REQUEST, "x" * 2000))  # too long: the channel's waiters
    assert mine.is_set() and not other.is_set()


# -- two processes on PostgreSQL -----------------------------------------------------------


async def _listening(*stores: Store) -> None:
    await _until(lambda: all(s.wakeups.listening for s in stores))


async def test_a_committed_notify_wakes_the_other_store_and_a_rolled_back_one_does_not(
    two_stores: tuple[Store, Store],
) -> None:
    here, there = two_stores
    there.wakeups.safety_s = LONG
    await _listening(here, there)
    failed = there.wakeups.event(wake.APPENDED, "failed")
    ok = there.wakeups.event(wake.APPENDED, "ok")
    with trio.fail_after(20):
        with pytest.raises(Boom):
            await here.write(_notify_then(wake.APPENDED, "failed", fail=True))
        await here.write(_notify_then(wake.APPENDED, "ok"))
        await ok.wait()  # notifications come in commit order: "failed" would be here by now
    assert not failed.is_set()
    assert there.wakeups.counters["received"] >= 1
    # Its own notifications come back to no store: the writer's are skipped by its listener.
    assert here.wakeups.counters["received"] == 0


async def test_a_stream_shared_by_two_processes_wakes_its_drainer_and_producer(
    two_stores: tuple[Store, Store],
) -> None:
    """The producer appends in one instance and the drainer acks in another; with polls that
    never come, only the wake-ups move them."""
    for store in two_stores:
        store.wakeups.safety_s = LONG
    await _listening(*two_stores)
    here, there = Outbox(two_stores[0]), Outbox(two_stores[1])
    got: list[int] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:

            async def drain() -> None:
                while len(got) < 6:
                    batch = await there.next_batch("queue:x", 10)
                    got.extend(item.seq for item in batch)
                    await there.ack("queue:x", batch[-1].seq)

            nursery.start_soon(drain)
            for n in range(3):
                await here.append("queue:x", [NewItem(key=f"k{n}{i}", body=b"x") for i in range(2)])
                await here.wait_pending_below("queue:x", 1)  # acked in the other process
    assert got == [1, 2, 3, 4, 5, 6]


async def test_a_cut_listen_connection_falls_back_to_the_safety_poll_and_reconnects(
    pg_schema: tuple[str, str],
) -> None:
    dsn, schema = pg_schema
    target = conninfo_to_dict(dsn)
    proxy = TcpProxy(str(target.get("host") or "127.0.0.1"), int(target.get("port") or 5432))
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        listener: PostgresBackend = pg_backend(dsn, schema)
        listener.listen_dsn = make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))
        async with open_store(pg_backend(dsn, schema)) as here, open_store(listener) as there:
            there.wakeups.safety_s = LONG
            await _listening(here, there)
            producer, drainer = Outbox(here), Outbox(there)
            got: list[int] = []
            arrived = trio.Event()

            async def drain() -> None:
                while True:
                    batch = await drainer.next_batch("s", 10)
                    got.extend(item.seq for item in batch)
                    await drainer.ack("s", batch[-1].seq)
                    arrived.set()

            async with trio.open_nursery() as inner:
                inner.start_soon(drain)
                with trio.fail_after(30):
                    await producer.append("s", [NewItem(key="1", body=b"x")])
                    await arrived.wait()  # through the LISTEN connection
                    arrived = trio.Event()

                    there.wakeups.safety_s = 0.2  # the net while no wake-up can come
                    proxy.cut()
                    await _until(lambda: not there.wakeups.listening)
                    await producer.append("s", [NewItem(key="2", body=b"x")])
                    await arrived.wait()  # found by the safety poll
                    arrived = trio.Event()
                    assert not there.wakeups.listening

                    there.wakeups.safety_s = LONG
                    proxy.resume()
                    await _until(lambda: there.wakeups.listening)
                    await producer.append("s", [NewItem(key="3", body=b"x")])
                    await arrived.wait()  # through the new LISTEN connection
                inner.cancel_scope.cancel()
            assert got == [1, 2, 3]
            assert there.wakeups.counters["reconnects"] == 1
            assert proxy.connections >= 2
        nursery.cancel_scope.cancel()
