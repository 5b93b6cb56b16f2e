"""The crawl tables in cluster mode: frontier claims (disjoint, in order, a dead claimant's rows
claimed again and a live one's not), a commit that finds its rows claimed by another, and the
crawl's end decided exactly once."""

from __future__ import annotations

import trio

from daemon.cluster import store as cs
from daemon.crawl.runs import store as crawlstore
from daemon.jobs import store as jobstore
from daemon.store import Conn, Store

JOB = "00000000-0000-4000-8000-000000000001"
A, B = "a/1111", "b/2222"


def new_job(conn: Conn, urls: int, *, kicked_off: bool = True) -> None:
    jobstore.insert_job(conn, job_id=JOB, kind="crawl", webhook=None, source={}, at_ms=1,
                        expires_ms=10)  # fmt: skip
    crawlstore.insert_job(conn, JOB, "crawl", "http://s.test/", b"{}")
    crawlstore.admit(conn, JOB, [(str(i), f"u/{i}", 0) for i in range(1, urls + 1)], urls)
    if kicked_off:
        crawlstore.set_kicked_off(conn, JOB)


def join(conn: Conn, claimant: str) -> None:
    instance = claimant.split("/")[0]
    cs.join(conn, instance=instance, claimant=claimant, host="h", pid=1, version="v",
            offers="{}", lease_ms=60_000)  # fmt: skip


def expire(conn: Conn, claimant: str) -> None:
    conn.execute("UPDATE cluster_members SET expires_ms = 0 WHERE claimant = ?", (claimant,))


async def two_members(store: Store, urls: int, *, kicked_off: bool = True) -> None:
    """A crawl of `urls` queued rows, and A and B live members."""

    def setup(conn: Conn) -> None:
        new_job(conn, urls, kicked_off=kicked_off)
        join(conn, A)
        join(conn, B)

    await store.write(setup)


def claim(claimant: str, limit: int, owner: bool = False) -> object:
    return lambda conn: [e.n for e in crawlstore.claim(conn, JOB, claimant, limit, owner=owner)]


async def test_claims_are_disjoint_in_order_and_stop_when_the_crawl_ends(store: Store) -> None:
    await two_members(store, 7)
    assert await store.write(claim(A, 2)) == [1, 2]
    assert await store.write(claim(B, 3)) == [3, 4, 5]
    assert await store.write(claim(A, 1)) == [6]
    left = await store.read(lambda c: crawlstore.backlog(c, JOB, B))
    assert (left.queued, left.claimable) == (7, 1)
    assert await store.write(lambda c: crawlstore.conclude(c, JOB, A, "cancelled")) == "cancelled"
    assert await store.write(claim(B, 5)) == []  # a cancelled crawl hands out nothing more
    assert await store.write(lambda c: crawlstore.lock_job(c, JOB)) == "cancelled"
    assert await store.read(lambda c: crawlstore.job_ending(c, JOB)) == "cancelled"


async def test_a_dead_claimants_rows_are_claimed_again_a_live_ones_not(store: Store) -> None:
    await two_members(store, 4)
    assert await store.write(claim(A, 3)) == [1, 2, 3]
    assert await store.write(claim(B, 10)) == [4]
    assert await store.write(claim(B, 10)) == []  # A is alive: its rows stay its own
    await store.write(lambda c: expire(c, A))
    assert await store.write(claim(B, 10)) == [1, 2, 3]

    def stale(conn: Conn) -> list[bool]:
        return [crawlstore.held_by(conn, JOB, 1, A), crawlstore.held_by(conn, JOB, 1, B)]

    # A wakes up: its page commit finds row 1 no longer its own and stores nothing for it.
    assert await store.read(stale) == [False, True]


async def test_a_paced_crawls_owner_takes_rows_of_a_previous_owner_but_not_its_own(
    store: Store,
) -> None:
    await two_members(store, 3)
    assert await store.write(claim(A, 2)) == [1, 2]
    assert await store.write(claim(B, 1, owner=True)) == [1]
    assert await store.write(claim(B, 5, owner=True)) == [2, 3]
    assert await store.write(claim(B, 5, owner=True)) == []
    await store.write(lambda c: crawlstore.release_claims(c, JOB, B))
    assert await store.write(claim(A, 5)) == [1, 2, 3]


async def test_the_end_is_decided_once_and_taken_over_from_a_dead_decider(store: Store) -> None:
    await two_members(store, 2, kicked_off=False)

    def conclude(claimant: str, ending: str = "completed") -> object:
        return lambda conn: crawlstore.conclude(conn, JOB, claimant, ending)

    def finish_rows(conn: Conn) -> None:
        for n in (1, 2):
            crawlstore.set_state(conn, JOB, n, "done")

    await store.write(finish_rows)
    assert await store.write(conclude(A)) is None  # not kicked off yet: nothing to end
    await store.write(lambda c: crawlstore.set_kicked_off(c, JOB))
    assert await store.write(conclude(A)) == "completed"
    assert await store.write(conclude(B)) is None
    assert await store.write(conclude(B, "cancelled")) is None
    assert await store.write(conclude(A)) == "completed"  # A asks again: still its to apply
    await store.write(lambda c: expire(c, A))  # A died before giving the job its status
    assert await store.write(conclude(B, "cancelled")) == "completed"
    assert await store.write(lambda c: crawlstore.conclude(c, JOB, A, "completed")) is None


async def test_two_stores_on_one_schema_claim_disjoint_rows_and_end_once(
    two_stores: tuple[Store, Store],
) -> None:
    a_store, b_store = two_stores
    urls = 400

    await two_members(a_store, urls)
    got: dict[str, list[int]] = {A: [], B: []}
    ends: set[tuple[str, str]] = set()

    async def worker(store: Store, claimant: str) -> None:
        while True:
            rows = await store.write(claim(claimant, 3))
            if not rows:
                left = await store.read(lambda c: crawlstore.backlog(c, JOB, claimant))
                if left.claimable:
                    continue
                if left.queued == 0:
                    break
                await trio.sleep(0.001)
                continue
            got[claimant] += rows

            def done(conn: Conn, rows: list[int] = rows) -> None:
                assert crawlstore.lock_job(conn, JOB) is None
                for n in rows:
                    assert crawlstore.held_by(conn, JOB, n, claimant)
                    crawlstore.set_state(conn, JOB, n, "done")

            await store.write(done)
        ending = await store.write(lambda c: crawlstore.conclude(c, JOB, claimant, "completed"))
        if ending is not None:
            ends.add((claimant, ending))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(worker, a_store, A)
                nursery.start_soon(worker, b_store, B)
    assert sorted(got[A] + got[B]) == list(range(1, urls + 1))
    assert got[A] and got[B]
    assert len(ends) == 1 and ends.pop()[1] == "completed"
