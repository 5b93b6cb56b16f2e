from __future__ import annotations

from typing import Any

import apsw
import msgspec
import pytest

from daemon import outbox
from daemon.config import WebhookSpec
from daemon.jobs import store as jobstore
from daemon.jobs.events import TerminalAlreadyIssued
from daemon.outbox import NewItem
from daemon.store import Store, one

HOOK = WebhookSpec(url="https://example.com/hook", metadata={"team": "a"})


def create(conn: apsw.Connection, job_id: str = "j1", webhook: WebhookSpec | None = HOOK) -> None:
    jobstore.insert_job(
        conn,
        job_id=job_id,
        kind="crawl",
        webhook=webhook,
        source={"task_id": "t1"},
        at_ms=1000,
        expires_ms=5000,
    )


async def test_insert_and_read_back(store: Store) -> None:
    await store.write(create)
    record = await store.read(lambda c: jobstore.get_job(c, "j1"))
    assert record is not None
    assert (record.kind, record.status, record.completed, record.total) == (
        "crawl",
        "scraping",
        0,
        0,
    )
    assert (record.created_ms, record.completed_ms, record.expires_ms) == (1000, None, 5000)
    assert record.webhook == HOOK and record.source == {"task_id": "t1"}
    assert (record.last_seq, record.terminated, record.finished) == (0, False, False)
    assert await store.read(lambda c: jobstore.get_job(c, "nope")) is None


async def test_unknown_kind_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="unknown job kind"):
        await store.write(
            lambda c: jobstore.insert_job(
                c, job_id="x", kind="scrape", webhook=None, source={}, at_ms=0, expires_ms=0
            )
        )


async def test_rows_are_numbered_in_order_and_counted(store: Store) -> None:
    await store.write(create)
    await store.write(lambda c: jobstore.add_rows(c, "j1", [{"a": 1}, {"a": 2}]))
    await store.write(lambda c: jobstore.add_rows(c, "j1", [{"a": 3}], total=10))
    record = await store.read(lambda c: jobstore.get_job(c, "j1"))
    assert record is not None and (record.completed, record.total) == (3, 10)
    rows, more = await store.read(lambda c: jobstore.read_rows(c, "j1", 0, 10, 1 << 20))
    assert rows == [b'{"a":1}', b'{"a":2}', b'{"a":3}'] and not more


@pytest.mark.parametrize(
    ("skip", "limit", "max_bytes", "expected", "more"),
    [
        (0, 2, 1 << 20, [0, 1], True),
        (2, 2, 1 << 20, [2, 3], True),
        (4, 2, 1 << 20, [4], False),
        (0, 10, 16, [0, 1], True),  # two 8-byte rows fill 16 bytes
        (0, 10, 1, [0], True),  # always at least one row
        (9, 10, 1 << 20, [], False),
    ],
)
async def test_read_rows_pages_by_count_and_size(
    store: Store, skip: int, limit: int, max_bytes: int, expected: list[int], more: bool
) -> None:
    await store.write(create)
    await store.write(lambda c: jobstore.add_rows(c, "j1", [{"n": i} for i in range(5)]))
    rows, has_more = await store.read(lambda c: jobstore.read_rows(c, "j1", skip, limit, max_bytes))
    assert rows == [f'{{"n":{i}}}'.encode() for i in expected]
    assert has_more is more


async def test_issue_seq_follows_the_filter_and_the_terminal(store: Store) -> None:
    only_pages = WebhookSpec(url=HOOK.url, events=["page"])
    await store.write(lambda c: create(c, webhook=only_pages))

    def issue(name: str, floor: int = 0) -> Any:
        def tx(conn: apsw.Connection) -> int | None:
            record = jobstore.get_job(conn, "j1")
            assert record is not None
            return jobstore.issue_seq(conn, record, name, floor)

        return store.write(tx)

    assert await issue("started") is None  # filtered: takes no seq
    assert await issue("page") == 1
    assert await issue("page", floor=5) == 6  # numbers issued in memory are never reused
    assert await issue("completed") is None  # filtered, but it still ends the stream
    with pytest.raises(TerminalAlreadyIssued):
        await issue("page")
    record = await store.read(lambda c: jobstore.get_job(c, "j1"))
    assert record is not None and (record.last_seq, record.terminated) == (6, True)


async def test_issue_seq_rolls_back_with_the_transaction(store: Store) -> None:
    await store.write(create)

    def fails(conn: apsw.Connection) -> None:
        record = jobstore.get_job(conn, "j1")
        assert record is not None
        jobstore.issue_seq(conn, record, "page")
        raise RuntimeError("caller failed")

    with pytest.raises(RuntimeError):
        await store.write(fails)
    record = await store.read(lambda c: jobstore.get_job(c, "j1"))
    assert record is not None and record.last_seq == 0


async def test_finish_once(store: Store) -> None:
    await store.write(create)
    before = await store.write(
        lambda c: jobstore.set_finished(c, "j1", "failed", "boom", 2000, 9000)
    )
    assert before.status == "scraping"
    record = await store.read(lambda c: jobstore.get_job(c, "j1"))
    assert record is not None
    assert (record.status, record.error, record.completed_ms, record.expires_ms) == (
        "failed", "boom", 2000, 9000,
    )  # fmt: skip
    with pytest.raises(jobstore.JobFinished, match="already failed"):
        await store.write(lambda c: jobstore.set_finished(c, "j1", "completed", None, 1, 1))
    with pytest.raises(jobstore.JobNotFound):
        await store.write(lambda c: jobstore.set_finished(c, "zz", "completed", None, 1, 1))
    with pytest.raises(ValueError, match="not a final job status"):
        await store.write(lambda c: jobstore.set_finished(c, "j1", "scraping", None, 1, 1))


async def test_errors_keep_their_order(store: Store) -> None:
    await store.write(create)
    for i in range(3):
        await store.write(
            lambda c, i=i: jobstore.add_error(
                c, "j1", code="E", error=f"e{i}", url=None if i else "u", at_ms=i
            )
        )
    errors = await store.read(lambda c: jobstore.list_errors(c, "j1"))
    assert [(e.error, e.url, e.at_ms) for e in errors] == [
        ("e0", "u", 0),
        ("e1", None, 1),
        ("e2", None, 2),
    ]
    assert len({e.id for e in errors}) == 3


async def test_resumable_lists_running_jobs_and_finished_ones_with_pending_events(
    store: Store,
) -> None:
    def setup(conn: apsw.Connection) -> None:
        for job_id in ("running", "drained", "pending"):
            create(conn, job_id)
        create(conn, "plain", webhook=None)
        for job_id in ("drained", "pending"):
            stream = jobstore.stream_name(job_id)
            outbox.append(conn, stream, [NewItem("k1", b"{}"), NewItem("k2", b"{}")], 0)
            outbox.ack(conn, stream, 2 if job_id == "drained" else 1)
            jobstore.set_finished(conn, job_id, "completed", None, 2000, 9000)

    await store.write(setup)
    found = await store.read(jobstore.resumable)
    assert sorted((r.id, pending) for r, pending in found) == [("pending", 1), ("running", 0)]


async def test_deliveries_give_cursor_pending_failed_and_gone(store: Store) -> None:
    def setup(conn: apsw.Connection) -> None:
        for job_id in ("sent", "stuck", "gone"):
            create(conn, job_id)
            stream = jobstore.stream_name(job_id)
            items = [NewItem(f"k{i}", b"{}") for i in range(4)]
            outbox.append(conn, stream, items, 0)
        create(conn, "plain", webhook=None)
        create(conn, "quiet")
        outbox.ack(conn, jobstore.stream_name("sent"), 4)
        outbox.ack(conn, jobstore.stream_name("stuck"), 1)
        for _ in range(2):
            jobstore.add_error(conn, "stuck", code="WEBHOOK_FAILED", error="x", url=None, at_ms=1)
        jobstore.add_error(conn, "stuck", code="OTHER", error="y", url=None, at_ms=1)
        jobstore.mark_gone(conn, "gone", event_id="gone:2", type_="crawl.page", url="u",
                           at_ms=1, stream=jobstore.stream_name("gone"), seq=2)  # fmt: skip

    await store.write(setup)
    ids = ["sent", "stuck", "gone", "plain", "quiet", "nope"]
    found = await store.read(lambda c: jobstore.deliveries(c, ids))
    assert set(found) == {"sent", "stuck", "gone", "quiet"}
    view = {k: (d.cursor, d.last_seq, d.pending, d.failed) for k, d in found.items()}
    assert view == {"sent": (4, 4, 0, 0), "stuck": (1, 4, 3, 2), "gone": (4, 4, 0, 0),
                    "quiet": (0, 0, 0, 0)}  # fmt: skip
    gone = found["gone"].gone
    assert gone is not None and (gone.event_id, gone.skipped) == ("gone:2", 2)
    assert found["stuck"].gone is None


async def test_expired_jobs_are_deleted_in_chunks_with_everything_they_own(store: Store) -> None:
    def setup(conn: apsw.Connection) -> None:
        create(conn, "old")
        create(conn, "running")
        jobstore.add_rows(conn, "old", [{"i": i} for i in range(5)])
        jobstore.add_error(conn, "old", code="E", error="x", url=None, at_ms=0)
        outbox.append(conn, jobstore.stream_name("old"), [NewItem("k", b"{}")], 0)
        jobstore.set_finished(conn, "old", "completed", None, 2000, 3000)

    await store.write(setup)
    assert await store.read(lambda c: jobstore.expired(c, 2999, 10)) == []
    assert await store.read(lambda c: jobstore.expired(c, 3000, 10)) == ["old"]
    steps = 1
    while not await store.write(lambda c: jobstore.delete_job(c, "old", 2)):
        steps += 1
    assert steps == 3  # 2 + 2 + 1 rows

    def counts(conn: apsw.Connection) -> tuple[int, ...]:
        return tuple(
            one(conn, f"SELECT count(*) FROM {table}")[0]
            for table in ("jobs", "job_rows", "job_errors", "outbox_items", "outbox_streams")
        )

    assert await store.read(counts) == (1, 0, 0, 0, 0)


async def test_queue_items_point_to_job_rows_and_hold_back_the_jobs_expiry(store: Store) -> None:
    rows = [msgspec.Raw(b'{"i":%d}' % i) for i in range(3)]
    queued = [NewItem(f"k{i}", bytes(row)) for i, row in enumerate(rows)]

    def setup(conn: apsw.Connection) -> None:
        create(conn, "run", webhook=None)
        first = jobstore.add_rows(conn, "run", rows)
        assert first == 1
        outbox.append(conn, "queue:q", queued, 0, bodies_in=("run", first))
        jobstore.set_finished(conn, "run", "completed", None, 2000, 3000)

    await store.write(setup)
    stored = "SELECT body, row_job, row_n FROM outbox_items ORDER BY seq"
    assert await store.read(lambda c: c.execute(stored).fetchall()) == [
        (b"", "run", 1),
        (b"", "run", 2),
        (b"", "run", 3),
    ]
    items = await store.read(lambda c: outbox.read_after_cursor(c, "queue:q", 10))
    assert [(i.key, i.body) for i in items] == [(q.key, q.body) for q in queued]

    # Past its expiry the job stays while queue items still need its rows, and goes after.
    assert await store.read(lambda c: jobstore.expired(c, 9000, 10)) == []
    await store.write(lambda c: outbox.ack(c, "queue:q", 2))
    assert await store.read(lambda c: jobstore.expired(c, 9000, 10)) == []
    await store.write(lambda c: outbox.ack(c, "queue:q", 3))
    assert await store.read(lambda c: jobstore.expired(c, 9000, 10)) == ["run"]


async def test_an_item_whose_job_row_is_gone_is_refused_not_sent_empty(store: Store) -> None:
    def setup(conn: apsw.Connection) -> None:
        create(conn, "run", webhook=None)
        first = jobstore.add_rows(conn, "run", [{"i": 1}])
        assert first is not None
        outbox.append(conn, "queue:q", [NewItem("k", b'{"i":1}')], 0, bodies_in=("run", first))
        conn.execute("DELETE FROM job_rows")

    await store.write(setup)
    with pytest.raises(LookupError, match="queue:q:1 points to a job row that is gone"):
        await store.read(lambda c: outbox.read_after_cursor(c, "queue:q", 10))


async def test_retry_state_is_stored_replaced_listed_and_goes_with_the_job(store: Store) -> None:
    def state(job: str, seq: int, attempts: int, next_ms: int) -> jobstore.RetryState:
        return jobstore.RetryState(
            job_id=job, seq=seq, attempts=attempts, next_ms=next_ms, last_status=503,
            last_error="HTTP 503", at_ms=next_ms - 5000,
        )  # fmt: skip

    def setup(conn: apsw.Connection) -> None:
        create(conn, "a")
        create(conn, "b")
        jobstore.save_retry(conn, state("a", 1, 1, 10_000))
        jobstore.save_retry(conn, state("a", 1, 2, 70_000))  # the next attempt failed too
        jobstore.save_retry(conn, state("b", 4, 5, 20_000))

    await store.write(setup)
    assert await store.read(lambda c: jobstore.retry_state(c, "a")) == state("a", 1, 2, 70_000)
    assert await store.read(lambda c: jobstore.retry_state(c, "zzz")) is None
    count, due = await store.read(lambda c: jobstore.retrying(c, 1))
    assert (count, due) == (2, [state("b", 4, 5, 20_000)])  # the one due soonest first

    await store.write(lambda c: jobstore.clear_retry(c, "b"))
    assert await store.read(lambda c: jobstore.retry_state(c, "b")) is None

    def finish(conn: apsw.Connection) -> None:
        jobstore.set_finished(conn, "a", "completed", None, 2000, 3000)

    await store.write(finish)
    await store.write(lambda c: jobstore.delete_job(c, "a", 100))
    assert await store.read(lambda c: jobstore.retrying(c, 10)) == (0, [])
