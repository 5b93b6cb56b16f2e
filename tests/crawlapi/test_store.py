"""The crawl tables: admission under a limit, dedupe, slots given back, redirect targets,
idempotency keys, and what a finished job leaves behind."""

from __future__ import annotations

from typing import Any

import apsw

from daemon.crawl.runs import store as crawlstore
from daemon.jobs import store as jobstore
from daemon.store import Store

JOB = "00000000-0000-4000-8000-000000000001"


def new_job(conn: apsw.Connection, kind: str = "crawl") -> None:
    jobstore.insert_job(conn, job_id=JOB, kind=kind, webhook=None, source={}, at_ms=1,
                        expires_ms=10)  # fmt: skip
    crawlstore.insert_job(conn, JOB, kind, "http://s.test/", b"{}")


async def test_admission_dedupes_and_respects_the_limit(store: Store) -> None:
    def tx(conn: apsw.Connection) -> list[list[crawlstore.FrontierEntry]]:
        new_job(conn)
        first = crawlstore.admit(conn, JOB, [("a", "http://s.test/a", 1), ("b", "u/b", 1),
                                             ("a", "http://s.test/a?dup", 1)], room=5)  # fmt: skip
        second = crawlstore.admit(conn, JOB, [("b", "u/b", 2), ("c", "u/c", 2), ("d", "u/d", 2),
                                              ("e", "u/e", 2)], room=5 - 2)  # fmt: skip
        return [first, second]

    first, second = await store.write(tx)
    assert [(e.n, e.url, e.depth) for e in first] == [(1, "http://s.test/a", 1), (2, "u/b", 1)]
    assert [e.url for e in second] == ["u/c", "u/d", "u/e"]

    def fail_one(conn: apsw.Connection) -> tuple[int, int, list[str]]:
        before = crawlstore.admitted(conn, JOB)
        crawlstore.set_state(conn, JOB, 1, "failed")  # gives its slot back
        crawlstore.set_state(conn, JOB, 2, "done")
        crawlstore.set_state(conn, JOB, 2, "failed")  # only queued rows change
        queued = [e.url for e in crawlstore.queued(conn, JOB, 0, 10)]
        return before, crawlstore.admitted(conn, JOB), queued

    assert await store.write(fail_one) == (5, 4, ["u/c", "u/d", "u/e"])


async def test_redirect_targets_are_claimed_once(store: Store) -> None:
    def tx(conn: apsw.Connection) -> list[Any]:
        new_job(conn)
        crawlstore.admit(conn, JOB, [("a", "u/a", 0), ("t", "u/t", 1)], room=10)
        return [
            crawlstore.claim_target(conn, JOB, "t", "u/t", 0),  # queued duplicate dropped
            crawlstore.state_of(conn, JOB, 2),
            crawlstore.claim_target(conn, JOB, "t", "u/t", 0),  # already produced
            crawlstore.claim_target(conn, JOB, "new", "u/new", 0),
            crawlstore.admitted(conn, JOB),
        ]

    assert await store.write(tx) == [True, "skipped", False, True, 1]


async def test_idempotency_keys_expire(store: Store) -> None:
    def tx(conn: apsw.Connection) -> list[str | None]:
        crawlstore.remember_idempotency(conn, "crawl:k", JOB, at_ms=100, forget_before_ms=0)
        return [
            crawlstore.idempotent_job(conn, "crawl:k", since_ms=50),
            crawlstore.idempotent_job(conn, "crawl:k", since_ms=100),
            crawlstore.idempotent_job(conn, "batch_scrape:k", since_ms=0),
        ]

    assert await store.write(tx) == [JOB, None, None]


async def test_finished_jobs_lose_their_frontier_and_deletion_cascades(store: Store) -> None:
    def setup(conn: apsw.Connection) -> None:
        new_job(conn)
        crawlstore.admit(conn, JOB, [(str(i), f"u/{i}", 0) for i in range(5)], room=10)
        assert crawlstore.add_robots_blocked(conn, JOB, ["u/x", "u/x", "u/y"]) == ["u/x", "u/y"]

    await store.write(setup)
    assert not await store.write(lambda c: crawlstore.purge_frontier(c, JOB, 3))
    assert await store.write(lambda c: crawlstore.purge_frontier(c, JOB, 3))
    assert await store.read(lambda c: crawlstore.frontier_size(c, JOB)) == 0
    while not await store.write(lambda c: jobstore.delete_job(c, JOB, 100)):
        pass
    assert await store.read(lambda c: crawlstore.robots_blocked(c, JOB)) == []
    assert await store.read(lambda c: crawlstore.get_job(c, JOB)) is None
