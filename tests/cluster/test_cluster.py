"""Cluster objects on one store: leases move, are fenced, and run their owner's work once."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from daemon.cluster import Cluster, Lease, LeaseLost
from daemon.store import Conn, Store, open_store


async def test_sqlite_has_one_member_that_takes_every_lease(tmp_path: Path) -> None:
    async with open_store(tmp_path / "crawld.db") as store, trio.open_nursery() as nursery:
        cluster = Cluster(store, instance="solo", lease_s=2.0, multi=False)
        await nursery.start(cluster.run)
        with trio.fail_after(5):
            lease = await cluster.acquire("collector:t1")
        assert lease.token == 1
        view = await cluster.view()
        assert [(m["instance"], m["alive"], m["holds"]) for m in view["members"]] == [
            ("solo", True, ["collector:t1"])
        ]
        nursery.cancel_scope.cancel()
    async with open_store(tmp_path / "crawld.db") as store:
        assert (
            await store.read(
                lambda c: c.execute("SELECT count(*) FROM cluster_members").fetchone()[0]
            )
            == 0
        )


async def test_run_owned_runs_in_one_place_and_moves_when_the_owner_stops(
    two_stores: tuple[Store, Store],
) -> None:
    runs: list[str] = []

    async def work(name: str, lease: Lease) -> None:
        runs.append(name)
        await trio.sleep_forever()

    a_store, b_store = two_stores
    a = Cluster(a_store, instance="a", lease_s=2.0, multi=True)
    b = Cluster(b_store, instance="b", lease_s=2.0, multi=True)
    async with trio.open_nursery() as outer:
        await outer.start(b.run)
        async with trio.open_nursery() as inner:
            await inner.start(a.run)
            inner.start_soon(a.run_owned, "duty", lambda lease: work("a", lease))
            with trio.fail_after(5):
                while "duty" not in a.held:
                    await trio.sleep(0.05)
            outer.start_soon(b.run_owned, "duty", lambda lease: work("b", lease))
            await trio.sleep(1.5)
            assert runs == ["a"]
            inner.cancel_scope.cancel()  # a stops cleanly: leaves and frees its leases
        with trio.fail_after(5):
            while runs != ["a", "b"]:
                await trio.sleep(0.05)
        outer.cancel_scope.cancel()


async def test_a_paused_owner_is_fenced_and_cancelled(two_stores: tuple[Store, Store]) -> None:
    a_store, b_store = two_stores
    a = Cluster(a_store, instance="a", lease_s=2.0, multi=True)
    b = Cluster(b_store, instance="b", lease_s=2.0, multi=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        await a.join()
        old = (await a.try_acquire(["duty"]))[0]
        # a never renews (its loop does not run, as if paused): b takes over once it runs out.
        with trio.fail_after(6):
            new = await b.acquire("duty")
        assert new.token == old.token + 1

        def stale_write(conn: Conn) -> None:
            old.check(conn)
            conn.execute("INSERT INTO cluster_requests(lease, action, from_instance, created_ms)"
                         " VALUES ('x', 'stale', 'a', 0)")  # fmt: skip

        with pytest.raises(LeaseLost):
            await a_store.write(stale_write)
        assert (
            await a_store.read(
                lambda c: c.execute("SELECT count(*) FROM cluster_requests").fetchone()[0]
            )
            == 0
        )
        # When a's loop runs again its renewal finds the token moved: the lease is lost.
        await a.tick()
        a._next_renewal = 0
        await a.tick()
        assert old.lost.is_set() and old.scope.cancel_called and "duty" not in a.held
        nursery.cancel_scope.cancel()


async def test_a_lease_not_renewed_in_time_steps_down(two_stores: tuple[Store, Store]) -> None:
    a_store, _ = two_stores
    a = Cluster(a_store, instance="a", lease_s=2.0, multi=True)
    cancelled = trio.Event()

    async def work(lease: Lease) -> None:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        nursery.start_soon(a.run_owned, "duty", work)
        with trio.fail_after(5):
            while "duty" not in a.held:
                await trio.sleep(0.05)
        lease = a.held["duty"]
        a._next_renewal = float("inf")  # renewals stop going through (an unreachable database)
        with trio.fail_after(5):
            await cancelled.wait()
        assert lease.lost.is_set()
        nursery.cancel_scope.cancel()


async def test_requests_reach_the_holder(two_stores: tuple[Store, Store]) -> None:
    a_store, b_store = two_stores
    a = Cluster(a_store, instance="a", lease_s=2.0, multi=True)
    b = Cluster(b_store, instance="b", lease_s=2.0, multi=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        lease = await a.acquire("collector:t1")
        assert await b.holder("collector:t1") == "a"
        await b.request("collector:t1", "start", {"by": "api"})
        with trio.fail_after(5):
            got = await a.requests(lease)
        assert [(r.action, r.body, r.from_instance) for r in got] == [("start", {"by": "api"}, "b")]
        nursery.cancel_scope.cancel()


async def test_try_now_tries_a_wanted_lease_at_once_and_says_whether_it_was_taken(
    two_stores: tuple[Store, Store],
) -> None:
    a_store, b_store = two_stores
    a = Cluster(a_store, instance="a", lease_s=30.0, multi=True)
    b = Cluster(b_store, instance="b", lease_s=30.0, multi=True)

    async def hold(lease: Lease) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        nursery.start_soon(a.run_owned, "duty", hold)
        with trio.fail_after(5):
            assert await a.try_now("duty")  # asked before its waiter even started waiting
        nursery.start_soon(b.run_owned, "duty", hold)
        with trio.fail_after(5):  # answered by a try, not when a's 30 s lease would run out
            assert not await b.try_now("duty")
        assert "duty" in a.held and "duty" not in b.held
        nursery.cancel_scope.cancel()
