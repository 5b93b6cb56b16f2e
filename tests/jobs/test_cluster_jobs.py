"""Jobs in cluster mode: the spread rules, the fencing of a drainer's writes (both backends),
and two instances (Cluster + JobManager) on one PostgreSQL schema handing a job's webhook
delivery over when its drainer's owner stops or stops renewing."""

from __future__ import annotations

import functools

import pytest
import trio

from daemon.cluster import Cluster, Lease, LeaseLost
from daemon.cluster import store as cs
from daemon.config import Duration, JobsConfig, WebhookSpec
from daemon.fakes.receiver import WebhookReceiver
from daemon.jobs import spread
from daemon.jobs import store as jobstore
from daemon.jobs.delivery import Deliverer, DeliverySettings, Final
from daemon.jobs.drainer import JobDrainer
from daemon.jobs.jobstate import JobState
from daemon.jobs.manager import JobManager
from daemon.outbox import NewItem, Outbox, append, read_after_cursor, stream_state
from daemon.store import Conn, Store
from tests.jobs.conftest import fast_webhooks
from tests.jobs.test_crash import poll

# -- rules -------------------------------------------------------------------------------------


def test_each_instance_takes_its_fair_share_and_at_least_one() -> None:
    free = ["j1", "j2", "j3", "j4", "j5", "j6"]
    assert spread.to_take(free, held_here=0, backlog_jobs=6, members=3) == ["j1", "j2"]
    assert spread.to_take(free, held_here=1, backlog_jobs=6, members=3) == ["j1"]
    # Over its share already, it still takes one: a live member that takes nothing never
    # stalls a job for longer than a scan.
    assert spread.to_take(free, held_here=5, backlog_jobs=6, members=3) == ["j1"]
    assert spread.to_take(free, held_here=0, backlog_jobs=6, members=1) == free
    assert spread.to_take([], held_here=0, backlog_jobs=0, members=0) == []


def test_free_jobs_skip_held_and_running_ones_biggest_backlog_first() -> None:
    backlog = {"a": 1, "b": 5, "c": 5, "d": 2}
    assert spread.free_jobs(backlog, held=["c"], running_here=["d"]) == ["b", "a"]
    assert spread.per_instance(["y", "x", "y"]) == {"x": 1, "y": 2}


# -- fencing on both backends -----------------------------------------------------------------

JOB = "00000000-0000-0000-0000-00000000000a"
LEASE = jobstore.stream_name(JOB)


async def _job_with_events(store: Store, count: int) -> None:
    def tx(conn: Conn) -> None:
        spec = WebhookSpec(url="http://127.0.0.1:9/hook")
        jobstore.insert_job(
            conn, job_id=JOB, kind="crawl", webhook=spec, source={}, at_ms=0, expires_ms=10**15
        )
        items = [NewItem(key=f"w{i}", body=b"{}", meta={"seq": i}) for i in range(1, count + 1)]
        append(conn, LEASE, items, 0)

    await store.write(tx)


async def _stale_and_current(store: Store) -> tuple[Lease, Lease]:
    """Two leases of the job's drainer: the first taken, then taken over (token + 1)."""
    first = await store.write(lambda c: cs.acquire(c, [LEASE], "a", 60_000))
    second = await store.write(lambda c: cs.acquire(c, [LEASE], "a", 60_000))
    deadline = trio.current_time() + 60
    return Lease(LEASE, first[LEASE], deadline), Lease(LEASE, second[LEASE], deadline)


def _drainer(store: Store, lease: Lease) -> JobDrainer:
    job = JobState(JOB, "crawl", WebhookSpec(url="http://127.0.0.1:9/hook"), durable=True)
    deliverer = Deliverer(DeliverySettings.from_config(fast_webhooks()))
    return JobDrainer(job, deliverer, store, lease=lease, poll_s=1.0)


async def test_a_stale_token_moves_no_cursor_and_records_nothing(store: Store) -> None:
    await _job_with_events(store, 3)
    stale, current = await _stale_and_current(store)
    assert current.token == stale.token + 1
    old = _drainer(store, stale)
    error = {"code": "WEBHOOK_FAILED", "url": "u", "error": "e"}
    ack = functools.partial(old._ack_in_tx, seq=2, prune=True, error=error)
    with pytest.raises(LeaseLost):
        await old._write(ack)
    with pytest.raises(LeaseLost):
        await old._write(functools.partial(old._ack_in_tx, seq=1, prune=False, error=None))
    [item] = await store.read(lambda c: read_after_cursor(c, LEASE, 1))
    with pytest.raises(LeaseLost):
        await old._gone(item, Final("gone", 1, 410, "HTTP 410"), durable=True)
    with pytest.raises(LeaseLost):
        await old._skip_disk([item])

    def seen(conn: Conn) -> tuple[int, int, list[jobstore.JobError], object]:
        state = stream_state(conn, LEASE)
        return (
            state.ack_cursor,
            state.pending,
            jobstore.list_errors(conn, JOB),
            jobstore.webhook_gone(conn, JOB),
        )

    assert await store.read(seen) == (0, 3, [], None)
    # The current holder's writes go through.
    new = _drainer(store, current)
    await new._write(functools.partial(new._ack_in_tx, seq=2, prune=True, error=error))
    cursor, backlog, errors, gone = await store.read(seen)
    assert (cursor, backlog, len(errors), gone) == (2, 1, 1, None)


async def test_no_attempt_starts_once_the_lease_may_have_run_out(store: Store) -> None:
    await _job_with_events(store, 1)
    _, current = await _stale_and_current(store)
    current.deadline = trio.current_time()  # e.g. the process was paused past it
    drainer = _drainer(store, current)
    with pytest.raises(LeaseLost):
        await drainer.run()
    assert (await store.read(lambda c: stream_state(c, LEASE))).ack_cursor == 0


# -- two instances on one PostgreSQL schema ----------------------------------------------------


PAGES = 20
EVENTS = PAGES + 2


async def _started(nursery: trio.Nursery, store: Store, name: str) -> tuple[Cluster, JobManager]:
    """An instance (its Cluster and JobManager) running in `nursery`."""
    cluster, manager = _instance(store, name)
    await nursery.start(cluster.run)
    await nursery.start(manager.run)
    return cluster, manager


def _instance(store: Store, name: str) -> tuple[Cluster, JobManager]:
    cluster = Cluster(store, instance=name, lease_s=2.0, multi=True)
    manager = JobManager(
        store, Outbox(store), JobsConfig(), fast_webhooks(timeout=Duration(5)), cluster=cluster
    )
    return cluster, manager


async def _produce(manager: JobManager, rx: WebhookReceiver) -> str:
    job = await manager.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
    for i in range(PAGES):
        await manager.page(job, [{"i": i}])
    await manager.finish(job, "completed")
    return job


def _delivered(rx: WebhookReceiver, job: str) -> int:
    return len(set(rx.seqs(job)))


def _check_once_in_order(rx: WebhookReceiver, job: str) -> None:
    rx.check()  # in order (a repeat of the latest is allowed), resends identical
    seqs = rx.seqs(job)
    first_time = [s for i, s in enumerate(seqs) if s not in seqs[:i]]
    assert first_time == list(range(1, EVENTS + 1))
    assert len(seqs) - len(first_time) <= 1, rx.duplicates


async def test_another_instance_continues_the_job_after_its_drainer_owner_stops(
    two_stores: tuple[Store, Store], rx: WebhookReceiver
) -> None:
    a_store, b_store = two_stores
    async with trio.open_nursery() as outer:
        b, mb = await _started(outer, b_store, "b")
        async with trio.open_nursery() as inner:
            _, ma = await _started(inner, a_store, "a")
            rx.delay_next(5, 0.01)
            rx.delay_next(EVENTS, 0.2)  # slow answers: a stops mid-stream
            job = await _produce(ma, rx)
            assert await b.holder(LEASE.replace(JOB, job)) == "a"
            # The API answers alike on both instances.
            assert await mb.get_job(job) == await ma.get_job(job)
            assert await mb.job_rows(job, 5, 3, 10**6) == await ma.job_rows(job, 5, 3, 10**6)
            assert await mb.job_errors(job) == await ma.job_errors(job)
            await poll(lambda: _delivered(rx, job) >= 5, 10)
            view = await mb.status()
            assert view["cluster"]["drainers"] == {"a": 1}
            assert view["cluster"]["jobs"][0]["instance"] == "a"
            inner.cancel_scope.cancel()  # a stops (a clean stop frees its leases)
        stopped_at = _delivered(rx, job)
        assert stopped_at < EVENTS
        rx.clear_faults()
        await poll(lambda: _delivered(rx, job) == EVENTS, 10)
        _check_once_in_order(rx, job)
        assert (await mb.get_job(job)).status == "completed"  # type: ignore[union-attr]
        await poll(lambda: mb._active.get(job) is None, 5)
        assert await b.holder(jobstore.stream_name(job)) is None  # released once drained
        outer.cancel_scope.cancel()


async def test_a_drainer_whose_lease_runs_out_sends_nothing_more_and_the_other_continues(
    two_stores: tuple[Store, Store], rx: WebhookReceiver
) -> None:
    a_store, b_store = two_stores
    a, ma = _instance(a_store, "a")
    async with trio.open_nursery() as nursery:
        b, _ = await _started(nursery, b_store, "b")
        await a.join()  # a's cluster loop never runs: its leases are not renewed (a pause)
        await nursery.start(ma.run)
        rx.delay_next(EVENTS, 0.3)
        job = await _produce(ma, rx)
        assert await b.holder(jobstore.stream_name(job)) == "a"
        # Once a's lease has run out it starts no attempt; b takes over after the cursor.
        await poll(lambda: jobstore.stream_name(job) in b.held, 8)
        await poll(lambda: _delivered(rx, job) == EVENTS, 20)
        _check_once_in_order(rx, job)
        assert ma._active.get(job) is None or not ma._active[job].drainer
        nursery.cancel_scope.cancel()


async def test_expiry_runs_on_one_instance_and_drops_the_jobs_drainer_lease(
    two_stores: tuple[Store, Store], rx: WebhookReceiver
) -> None:
    async with trio.open_nursery() as nursery:
        (a, ma), (b, mb) = [
            await _started(nursery, s, n) for s, n in zip(two_stores, "ab", strict=True)
        ]
        for manager in (ma, mb):
            manager.jobs_cfg = JobsConfig(ttl=Duration(1))
            await nursery.start(manager.run_cleanup)
        await poll(lambda: "jobs:expiry" in a.held or "jobs:expiry" in b.held, 5)
        await trio.sleep(1.0)
        assert ("jobs:expiry" in a.held) != ("jobs:expiry" in b.held)
        job = await _produce(mb, rx)
        await poll(lambda: _delivered(rx, job) == EVENTS, 10)

        async def gone() -> bool:
            def read(conn: Conn) -> tuple[object, list[dict[str, object]]]:
                return jobstore.get_job(conn, job), cs.leases(conn, jobstore.stream_name(job))

            return await two_stores[1].read(read) == (None, [])

        with trio.fail_after(10):
            while not await gone():
                await trio.sleep(0.2)
        nursery.cancel_scope.cancel()


# -- two instances writing for one job ---------------------------------------------------------


async def test_two_instances_never_issue_one_event_number_or_row_twice(
    two_stores: tuple[Store, Store],
) -> None:
    """A crawl's pages commit on whichever instance fetched them: each transaction locks the job
    row before it reads the last event number and row, so concurrent writers queue up."""
    a, b = two_stores
    spec = WebhookSpec(url="http://127.0.0.1:9/hook")
    await a.write(
        lambda conn: jobstore.insert_job(
            conn, job_id=JOB, kind="crawl", webhook=spec, source={}, at_ms=0, expires_ms=10**15
        )
    )
    seqs: list[int] = []

    def page(conn: Conn) -> None:
        record = jobstore.require_running(conn, JOB)
        jobstore.add_rows(conn, JOB, [{"p": 1}])
        seq = jobstore.issue_seq(conn, record, "page")
        assert seq is not None
        seqs.append(seq)

    async def writer(store: Store) -> None:
        for _ in range(40):
            await store.write(page)

    async with trio.open_nursery() as nursery:
        for store in (a, b, a, b):
            nursery.start_soon(writer, store)
    assert sorted(seqs) == list(range(1, 161))
    rows = await a.read(lambda c: c.execute("SELECT n FROM job_rows ORDER BY n").fetchall())
    assert [r[0] for r in rows] == list(range(1, 161))
