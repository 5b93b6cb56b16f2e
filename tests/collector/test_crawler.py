"""TaskCrawler against the Octoparse simulator (real HTTP), a real store and the embedded queue."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import apsw
import httpx
import msgspec
import pytest
import trio

from daemon.collector import config, paging, runrules
from daemon.collector.crawler import AlreadyRunning, TaskCrawler, load_task_state, save_progress
from daemon.collector.octoparse import OctoparseClient, Page, RetryPolicy
from daemon.fakes.octoparse import DEMO_PASSWORD, OctoparseSim, serve_sim
from daemon.jobs.store import JobFinished, JobNotFound
from daemon.net.ratelimit import RateLimiter
from daemon.outbox import Outbox
from daemon.store import Store, open_store

DAY = 86_400_000
STREAM = "queue:test"


@dataclass
class Env:
    sim: OctoparseSim
    task_id: str
    store: Store
    outbox: Outbox
    client: OctoparseClient
    account: config.AccountConfig

    def crawler(self, **task_options: object) -> TaskCrawler:
        task = config.TaskConfig(
            id="t1", account="main", task_id=self.task_id, date_field="发布时间", **task_options
        )  # type: ignore[arg-type]
        collector = config.CollectorConfig(batch_size=100, filter_days=7, max_expired_batches=3)
        return TaskCrawler(
            task,
            collector,
            client=self.client,
            store=self.store,
            outbox=self.outbox,
            stream=STREAM,
            fixed_ttl_ms=604_800_000,
        )

    async def queued(self) -> list[dict[str, str]]:
        items, _ = await self.outbox.take(STREAM, 1_000_000)
        return [msgspec.json.decode(i.body) for i in items]

    def add_rows(self, old: int = 0, new: int = 0) -> None:
        now = int(time.time() * 1000)
        self.sim.append_dated(self.task_id, [now - 10 * DAY - i for i in range(old)])
        self.sim.append_dated(self.task_id, [now - DAY + i for i in range(new)])


@pytest.fixture
async def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Env]:
    monkeypatch.setenv("SIM_PW", DEMO_PASSWORD)
    async with open_store(tmp_path / "db") as store, sim_env(store) as opened:
        yield opened


@asynccontextmanager
async def sim_env(store: Store) -> AsyncIterator[Env]:
    """The simulator served on a free port, a client for it and `store` (SIM_PW must be set)."""
    sim = OctoparseSim(token_lifetime=3600)
    task_id = sim.add_task("jobs")
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(
            lambda task_status: serve_sim(
                sim, "127.0.0.1:0", shutdown=stop, task_status=task_status
            )
        )
        account = config.AccountConfig(
            name="main", base_url=f"http://{host}:{port}", username="demo", password_env="SIM_PW"
        )
        async with httpx.AsyncClient() as http:
            client = OctoparseClient(
                account,
                http,
                RateLimiter(1000.0),
                retry=RetryPolicy(attempts=6, base=0.001, cap=0.01),
            )
            yield Env(sim, task_id, store, Outbox(store), client, account)
        stop.set()


def serials(rows: list[dict[str, str]]) -> list[int]:
    return sorted(int(r["序号"]) for r in rows)


async def test_first_run_keeps_recent_rows_and_stops_after_expired_windows(env: Env) -> None:
    env.add_rows(old=2000, new=250)
    stats = await env.crawler().run_once()
    assert stats.status == "completed" and stats.end == "expired"
    assert serials(await env.queued()) == list(range(2000, 2250))
    # 3 windows of new rows (the third mixed), then 3 all-expired windows, nothing more
    assert stats.windows == 6
    assert stats.fetched == 600
    assert stats.dropped.expired == 350
    offsets = [o for o, _ in env.sim.data_offsets(env.task_id) if o > 0]
    assert offsets == [2150, 2050, 1950, 1850, 1750, 1650]


async def test_incremental_run_fetches_only_new_rows_without_overlap(env: Env) -> None:
    env.add_rows(old=100, new=300)
    crawler = env.crawler()
    await crawler.run_once()
    assert len(await env.queued()) == 300
    env.add_rows(new=130)
    stats = await crawler.run_once()
    assert (stats.range_low, stats.range_high) == (400, 530)
    assert serials(await env.queued()) == list(range(400, 530))
    assert stats.fetched == 130
    stats = await crawler.run_once()
    assert stats.fetched == 0 and await env.queued() == []


async def test_rows_added_during_a_run_go_to_the_next_run(env: Env) -> None:
    env.add_rows(new=500)
    env.sim.grow(env.task_id, 7)  # every data request appends 7 fresh rows
    crawler = env.crawler()
    first = await crawler.run_once()
    assert first.range_high == 507  # the total probe itself grew the task once
    env.sim.grow(env.task_id, 0)
    total = len(env.sim.task(env.task_id).rows)
    await crawler.run_once()
    got = serials(await env.queued())
    assert got == list(range(total))  # every row exactly once across the two runs


async def test_short_pages_cover_every_row_once(env: Env) -> None:
    env.add_rows(new=470)
    env.sim.page_cap = 30
    stats = await env.crawler().run_once()
    assert stats.status == "completed"
    assert serials(await env.queued()) == list(range(470))


async def test_shrinking_total_resets_and_rescans(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    env.add_rows(new=200)
    crawler = env.crawler()
    await crawler.run_once()
    await env.queued()
    env.sim.truncate(env.task_id, 0)
    env.add_rows(new=50)
    stats = await crawler.run_once()
    assert stats.reset
    assert len(await env.queued()) == 50
    assert "task total fell below" in caplog.text


async def test_rate_limits_and_error_bodies_are_retried(env: Env) -> None:
    env.add_rows(new=400)
    env.sim.throttle(every=3)
    env.sim.fail(2, code="ServerError")
    stats = await env.crawler().run_once()
    assert stats.status == "completed"
    assert serials(await env.queued()) == list(range(400))
    served = env.sim.faults_served
    assert sum(n for k, n in served.items() if k.startswith("429")) > 0
    assert served["200 ServerError"] == 2


async def test_token_expiry_mid_run(env: Env) -> None:
    env.add_rows(new=600)
    crawler = env.crawler()

    async def expire_after_two_windows() -> None:
        while crawler.current is None or crawler.current.windows < 2:
            await trio.sleep(0.001)
        env.sim.expire_tokens()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(expire_after_two_windows)
        stats = await crawler.run_once()
    assert stats.status == "completed"
    assert serials(await env.queued()) == list(range(600))
    assert env.sim.grants["password"] == 2  # the rejected token led to one fresh login


async def test_manual_stop_then_resume_covers_the_rest(env: Env) -> None:
    env.add_rows(new=1000)
    crawler = env.crawler()
    seen = 0

    async def stop_after_two_windows() -> None:
        nonlocal seen
        while crawler.current is None or crawler.current.windows < 2:
            await trio.sleep(0.001)
        crawler.request_stop()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_after_two_windows)
        stats = await crawler.run_once()
    assert stats.status == "stopped"
    first = serials(await env.queued())
    seen = len(first)
    assert 200 <= seen < 1000
    state = await env.store.read(lambda c: load_task_state(c, "t1"))
    assert isinstance(state.progress, paging.BackwardProgress) and state.progress.end is None
    resumed = await crawler.run_once()
    assert resumed.resumed and resumed.status == "completed"
    assert sorted(first + serials(await env.queued())) == list(range(1000))


async def test_crash_mid_run_resumes_unfinished_range(env: Env) -> None:
    env.add_rows(new=800)
    crawler = env.crawler()
    with trio.move_on_after(30) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(crawler.run_once)
            while crawler.current is None or crawler.current.windows < 3:
                await trio.sleep(0.001)
            scope.cancel()  # the "crash": the run dies between windows
    before = serials(await env.queued())
    fresh = env.crawler()  # a new process would start from the stored progress
    stats = await fresh.run_once()
    assert stats.resumed
    assert sorted(before + serials(await env.queued())) == list(range(800))


async def test_missing_and_unparseable_dates_policy(env: Env) -> None:
    env.add_rows(new=10)
    env.sim.task(env.task_id).rows.extend(
        [{"标题": "x", "序号": "10"}, {"标题": "y", "序号": "11", "发布时间": "soon"}]
    )
    dropped = await env.crawler().run_once()
    assert (dropped.dropped.missing, dropped.dropped.unparseable) == (1, 1)
    assert len(await env.queued()) == 10


async def test_keep_policy_and_record_ttl(env: Env, tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    env.sim.append_dated(env.task_id, [now - 6 * DAY, now - DAY])
    env.sim.task(env.task_id).rows.append({"标题": "x", "序号": "2"})
    crawler = env.crawler(missing_date="keep", ttl_from="record")
    await crawler.run_once()
    items, _ = await env.outbox.take(STREAM, 10)
    by_serial = {msgspec.json.decode(i.body)["序号"]: i for i in items}
    assert set(by_serial) == {"0", "1", "2"}
    remaining_0 = by_serial["0"].expires_ms - now  # type: ignore[operator]
    assert DAY - 60_000 < remaining_0 <= DAY + 60_000  # 7 days minus 6 days old
    assert "ttl_ms" not in by_serial["0"].meta
    assert by_serial["2"].meta.get("ttl_ms") is None


class RecordingJobs:
    """A JobSink that records what the crawler tells the jobs part."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.finished: list[tuple[str, str, str | None]] = []
        self.pages: list[tuple[str, int]] = []
        self.attached: list[str] = []
        self.detached: list[str] = []

    async def create_job(self, kind: str, *, webhook: object, source: dict[str, object]) -> str:
        self.created.append(f"job-{len(self.created) + 1}")
        return self.created[-1]

    def page_in_tx(self, conn: object, job_id: str, rows: list[dict[str, object]]) -> object:
        self.pages.append((job_id, len(rows)))
        return SimpleNamespace(first_row=None)  # rows not stored: queue items keep their bodies

    async def after_commit(self, pending: object) -> None:
        pass

    async def finish(self, job_id: str, status: str, error: str | None = None) -> None:
        self.finished.append((job_id, status, error))

    def cancel_requested(self, job_id: str) -> trio.Event:
        return trio.Event()

    async def attach(self, job_id: str) -> None:
        if job_id not in self.created and not job_id.startswith("left-"):
            raise JobNotFound(job_id)
        if any(job == job_id for job, _, _ in self.finished):
            raise JobFinished(job_id, "finished")
        self.attached.append(job_id)

    def detach(self, job_id: str) -> None:
        self.detached.append(job_id)


async def test_the_job_of_a_run_killed_mid_way_is_continued_at_start(env: Env) -> None:
    env.add_rows(new=300)
    unfinished = paging.BackwardProgress(low=0, t0=300, lowest_done=200)
    await env.store.write(
        lambda c: save_progress(c, "t1", unfinished, "run-0", "left-0", int(time.time() * 1000))
    )
    jobs = RecordingJobs()
    crawler = env.crawler()
    crawler.collector = config.CollectorConfig(auto_start=False, batch_size=100)
    crawler.jobs = jobs  # type: ignore[assignment]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(crawler.run)  # no auto_start: the left job continues anyway
            while crawler.last_result is None or crawler.running:
                await trio.sleep(0.001)
            nursery.cancel_scope.cancel()
    assert jobs.created == []  # no new job: the same id goes on
    assert jobs.finished == [("left-0", "completed", None)]
    assert sum(n for job, n in jobs.pages if job == "left-0") == 200  # only the unfinished part
    assert crawler.last_result is not None and crawler.last_result.continues
    assert serials(await env.queued()) == list(range(200))


async def test_a_job_whose_windows_were_all_committed_is_completed_at_start(env: Env) -> None:
    env.add_rows(new=300)
    done = paging.BackwardProgress(low=0, t0=300, lowest_done=0, end="done")
    await env.store.write(
        lambda c: save_progress(c, "t1", done, "run-0", "left-0", int(time.time() * 1000))
    )
    jobs = RecordingJobs()
    crawler = env.crawler()
    crawler.collector = config.CollectorConfig(auto_start=False, batch_size=100)
    crawler.jobs = jobs  # type: ignore[assignment]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(crawler.run)
            nursery.cancel_scope.cancel()
    assert jobs.finished == [("left-0", "completed", None)] and jobs.pages == []


async def test_a_shutdown_mid_run_leaves_the_job_running_for_the_next_start(env: Env) -> None:
    env.add_rows(new=800)
    jobs = RecordingJobs()
    crawler = env.crawler()
    crawler.jobs = jobs  # type: ignore[assignment]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(crawler.run_once)
            while crawler.current is None or crawler.current.windows < 3:
                await trio.sleep(0.001)
            nursery.cancel_scope.cancel()  # SIGTERM: the run is cut short between windows
    assert jobs.created == ["job-1"] and jobs.finished == []  # not cancelled
    assert jobs.detached == ["job-1"]
    cut = crawler.last_result
    assert cut is not None and cut.status == "interrupted" and cut.interrupted
    assert "shutdown" in (cut.error or "")
    fresh = env.crawler()  # the next start
    fresh.collector = config.CollectorConfig(auto_start=False, batch_size=100)
    fresh.jobs = jobs  # type: ignore[assignment]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(fresh.run)
            while fresh.running:
                await trio.sleep(0.001)
            nursery.cancel_scope.cancel()
    assert jobs.created == ["job-1"] and jobs.finished == [("job-1", "completed", None)]
    assert serials(await env.queued()) == list(range(800))


async def test_a_user_stop_ends_the_job_cancelled_saying_so(env: Env) -> None:
    env.add_rows(new=500)
    jobs = RecordingJobs()
    crawler = env.crawler()
    crawler.jobs = jobs  # type: ignore[assignment]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(crawler.run_once)
            while crawler.current is None or crawler.current.windows < 1:
                await trio.sleep(0.001)
            assert crawler.request_stop()
    assert jobs.finished == [("job-1", "cancelled", "stopped by a user (POST /crawl/stop)")]


async def test_removing_the_task_ends_its_job_cancelled_saying_so(env: Env) -> None:
    env.add_rows(new=800)
    jobs = RecordingJobs()
    crawler = env.crawler()
    crawler.jobs = jobs  # type: ignore[assignment]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(crawler.run_once)
            while crawler.current is None or crawler.current.windows < 2:
                await trio.sleep(0.001)
            crawler.removed = "the task was removed from the configuration (reload)"
            nursery.cancel_scope.cancel()
    assert jobs.finished == [
        ("job-1", "cancelled", "the task was removed from the configuration (reload)")
    ]


async def test_a_store_failure_mid_run_continues_the_same_job_here(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runrules, "retry_in_s", lambda attempt: 0.01)
    env.add_rows(new=600)
    jobs = RecordingJobs()
    crawler = env.crawler()
    crawler.collector = config.CollectorConfig(auto_start=False, batch_size=100)
    crawler.jobs = jobs  # type: ignore[assignment]
    real_page = env.client.data_page
    calls = 0
    seen: list[Any] = []

    async def page_then_fail(task_id: str, offset: int, size: int) -> Page:
        nonlocal calls
        calls += 1
        if calls in (3, 4):  # two windows in, the database goes away for two tries
            raise apsw.IOError("disk I/O error (simulated)")
        return await real_page(task_id, offset, size)

    env.client.data_page = page_then_fail  # type: ignore[method-assign]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(crawler.run)
            await crawler.start_now()
            while crawler.running:
                if crawler.continuing is not None:
                    seen.append(crawler.continuing.attempts)
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert jobs.created == ["job-1"] and jobs.finished == [("job-1", "completed", None)]
    assert max(seen) == 2  # /status showed the job waiting to continue, twice
    assert crawler.last_result is not None and crawler.last_result.continues
    assert serials(await env.queued()) == list(range(600))


async def test_two_manual_starts_at_once_one_runs_one_is_refused(env: Env) -> None:
    env.add_rows(new=100)
    jobs = RecordingJobs()
    crawler = env.crawler()
    crawler.collector = config.CollectorConfig(auto_start=False, batch_size=100)
    crawler.jobs = jobs  # type: ignore[assignment]
    answers: list[str] = []

    async def start() -> None:
        try:
            answers.append(f"started {await crawler.start_now()}")
        except AlreadyRunning:
            answers.append("busy")

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(crawler.run)
            async with trio.open_nursery() as clients:
                clients.start_soon(start)
                clients.start_soon(start)
            while crawler.running or crawler.last_result is None:
                await trio.sleep(0.001)
            nursery.cancel_scope.cancel()
    assert sorted(answers) == ["busy", "started job-1"]
    assert jobs.created == ["job-1"] and jobs.finished == [("job-1", "completed", None)]


async def test_stop_is_heard_while_waiting_for_queue_room(env: Env) -> None:
    env.add_rows(new=500)
    crawler = env.crawler()
    crawler.collector = config.CollectorConfig(batch_size=100, max_pending=150)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(crawler.run_once)
            while crawler.current is None or crawler.current.windows < 2:
                await trio.sleep(0.001)
            await trio.sleep(0.05)  # nobody consumes: the run now waits for room
            assert crawler.current is not None and crawler.current.windows == 2
            assert crawler.request_stop()
    assert crawler.last_result is not None and crawler.last_result.status == "stopped"


async def test_empty_page_fails_the_run_and_the_next_run_asks_again(env: Env) -> None:
    env.add_rows(new=300)
    crawler = env.crawler()
    env.sim.page_cap = 0  # upstream answers empty pages although total says 300
    failed = await crawler.run_once()
    assert failed.status == "failed" and "no rows at offset 200" in (failed.error or "")
    env.sim.page_cap = None
    resumed = await crawler.run_once()
    assert resumed.resumed and resumed.status == "completed"
    assert serials(await env.queued()) == list(range(300))
