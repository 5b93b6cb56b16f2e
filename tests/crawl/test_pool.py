"""The content workers (daemon/crawl/content/pool.py): documents equal to the inline path's, a
dead worker costs its page only, cancelling kills the busy worker, the bound, and the config key.

Calls that must stay busy block on reading a FIFO the test writes to when it is done, so no test
sleeps."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from daemon.crawl.config import CrawlConfig
from daemon.crawl.content.document import DocumentOptions, scrape_page_of
from daemon.crawl.content.pool import PagePool, WorkerLost, pool_size
from daemon.crawl.documents.errors import DocumentError
from daemon.crawl.documents.parsers import ParserPlan, PdfParser
from daemon.crawl.documents.pdf import read_pdf_of
from daemon.crawl.documents.reader import DocumentReader
from daemon.crawl.fetching.fetch import FetchError, FetchResult
from daemon.crawl.runs.engine import new_engine
from daemon.crawl.runs.service import PRELOAD
from daemon.fakes.site import RICH_PAGE, SiteSim
from daemon.settings import ConfigError, decode
from tests.crawl.pdfs import make_pdf
from tests.crawl.pool_calls import die, fail, odd, pid, policy, wait_on
from tests.crawl.test_document import PAGE

PLAN = ParserPlan(PdfParser(mode="fast"))


@pytest.fixture
async def pool() -> AsyncIterator[PagePool]:
    opened = PagePool(2, preload=PRELOAD)
    yield opened
    await opened.aclose()


def fifo(tmp_path: Path, name: str = "go") -> str:
    path = tmp_path / name
    os.mkfifo(path)
    return str(path)


async def release(path: str, line: str = "done") -> None:
    def write() -> None:
        with open(path, "w") as f:
            f.write(line + "\n")

    await trio.to_thread.run_sync(write)


def result(url: str, body: str, content_type: str = "text/html; charset=utf-8") -> FetchResult:
    return FetchResult(
        requested_url=url, url=url, status_code=200, content_type=content_type, headers={},
        body=body.encode(),
    )  # fmt: skip


def pages() -> list[FetchResult]:
    site = SiteSim(pages=20)
    tree = [result(f"http://site.test/pages/{i}", site._tree_page(i)) for i in (0, 7, 19)]
    return [
        *tree,
        result("http://site.test/docs/page", PAGE),
        result("http://site.test/rich", RICH_PAGE),
        result("http://site.test/data.json", '{"a": [1, 2]}', "application/json"),
        result("http://site.test/latin", "<p>caf\xe9</p>", "text/html; charset=latin-1"),
    ]


OPTIONS = [
    DocumentOptions(),
    DocumentOptions(
        formats=frozenset({"markdown", "html", "rawHtml", "links", "images"}),
        only_main_content=False,
    ),
    DocumentOptions(
        formats=frozenset({"markdown", "links"}),
        include_tags=("article",),
        exclude_tags=(".ad",),
        remove_base64_images=False,
        attributes=(("meta[name=description]", "content"), ("a", "href")),
    ),
]


async def test_documents_from_the_pool_equal_the_inline_ones(pool: PagePool) -> None:
    for options in OPTIONS:
        for page in pages():
            args = (page, options, page.url + "?from", "scrape-1")
            inline = scrape_page_of(*args)
            assert await pool.run(scrape_page_of, *args) == inline
            assert inline[0]["metadata"]["url"] == page.url
    assert pool.status()["calls"] == len(OPTIONS) * len(pages())


async def test_workers_take_their_turn_rather_than_preempt(pool: PagePool) -> None:
    assert await pool.run(policy) == os.SCHED_BATCH
    assert os.sched_getscheduler(0) != os.SCHED_BATCH


async def test_exceptions_come_back_and_the_worker_stays(pool: PagePool) -> None:
    first = await pool.run(pid)
    with pytest.raises(ValueError, match="bad page"):
        await pool.run(fail)
    with pytest.raises(RuntimeError, match="CODE: what went wrong"):
        await pool.run(odd)
    assert await pool.run(pid) == first
    assert pool.status()["started"] == 1


async def test_a_dead_worker_costs_its_page_only(pool: PagePool, tmp_path: Path) -> None:
    go = fifo(tmp_path)
    other: list[str] = []

    async def busy() -> None:
        other.append(await pool.run(wait_on, go))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(busy)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(WorkerLost):
            await pool.run(die)
        assert pool.status()["lost"] == 1
        await release(go)
    assert other == ["done"]  # the page in the other worker was not touched
    assert await pool.run(scrape_page_of, pages()[0], DocumentOptions(), "u", "s")
    assert pool.status() | {"calls": 0} == {
        "size": 2, "processes": 1, "busy": 0, "waiting": 0, "calls": 0, "started": 2,
        "lost": 1, "killed": 0,
    }  # fmt: skip


async def test_a_worker_killed_from_outside_mid_page(pool: PagePool, tmp_path: Path) -> None:
    go = fifo(tmp_path)
    victim = await pool.run(pid)

    async def kill_it() -> None:
        await trio.testing.wait_all_tasks_blocked()
        os.kill(victim, signal.SIGKILL)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(kill_it)
        with pytest.raises(WorkerLost):
            await pool.run(wait_on, go)
    assert await pool.run(pid) != victim


def processes(pool: PagePool) -> list[Any]:
    return [worker.process for worker in pool._all]


async def ended(process: Any) -> int | None:
    await trio.to_thread.run_sync(process.join, 30)
    return process.exitcode  # type: ignore[no-any-return]


async def test_cancelling_a_page_kills_its_worker(pool: PagePool, tmp_path: Path) -> None:
    go = fifo(tmp_path)
    victim = await pool.run(pid)
    [process] = processes(pool)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.run, wait_on, go)
            await trio.testing.wait_all_tasks_blocked()
            assert pool.status()["busy"] == 1
            scope.cancel()
    assert scope.cancelled_caught
    assert pool.status()["busy"] == 0
    assert pool.status()["killed"] == 1
    assert await ended(process) == -signal.SIGKILL
    assert await pool.run(pid) != victim


async def test_callers_beyond_the_size_wait(tmp_path: Path) -> None:
    pool = PagePool(1, preload=PRELOAD)
    go = fifo(tmp_path)
    answers: list[Any] = []

    async def call(fn: Any, *args: Any) -> None:
        answers.append(await pool.run(fn, *args))

    try:
        await pool.run(pid)  # started: the busy call below waits on its answer, not a thread
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, wait_on, go)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(call, pid)
            await trio.testing.wait_all_tasks_blocked()
            assert pool.status()["waiting"] == 1
            assert pool.status()["processes"] == 1
            await release(go)
        assert answers[0] == "done"
    finally:
        await pool.aclose()


async def test_closing_ends_the_workers() -> None:
    pool = PagePool(2, preload=PRELOAD)
    await pool.run(pid)
    [process] = processes(pool)
    await pool.aclose()
    assert await ended(process) == 0  # it read end-of-file and returned
    with pytest.raises(WorkerLost):
        await pool.run(pid)


async def test_closing_under_a_busy_call_loses_its_page(tmp_path: Path) -> None:
    pool = PagePool(1, preload=PRELOAD)
    await pool.run(pid)
    [process] = processes(pool)
    go = fifo(tmp_path)
    lost: list[WorkerLost] = []

    async def close_soon() -> None:
        await trio.testing.wait_all_tasks_blocked()
        await pool.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(close_soon)
        try:
            await pool.run(wait_on, go)
        except WorkerLost as exc:
            lost.append(exc)
    assert lost  # not the socket's ClosedResourceError: a page that failed
    assert await ended(process) == -signal.SIGKILL
    assert pool.status()["killed"] == 1


async def test_the_engine_makes_a_lost_worker_a_failed_page() -> None:
    class Lost:
        async def run(self, *args: Any) -> Any:
            raise WorkerLost("gone")

    engine = new_engine(CrawlConfig(), pool=Lost())  # type: ignore[arg-type]
    with pytest.raises(FetchError) as info:
        await engine.document(pages()[0], DocumentOptions(), "http://site.test/pages/0")
    assert info.value.code == "SCRAPE_ALL_ENGINES_FAILED"
    assert engine.pages["worker_lost"] == 1
    await engine.fetcher.aclose()


def test_the_pool_size_key() -> None:
    assert decode("").crawl.content_workers == 0  # off: no faster on 2 cores (benchmarks)
    assert pool_size("auto") == len(os.sched_getaffinity(0))
    assert pool_size(decode("[crawl]\ncontent_workers = 0").crawl.content_workers) == 0
    for bad, where in [
        ("-1", "content_workers must be"),
        ("257", "content_workers must be"),
        ('"many"', "$.crawl.content_workers"),
        ("true", "$.crawl.content_workers"),
    ]:
        with pytest.raises(ConfigError) as info:
            decode(f"[crawl]\ncontent_workers = {bad}")
        assert where in str(info.value)


async def test_pdf_text_from_the_pool(pool: PagePool) -> None:
    pdf = make_pdf(["First page text", "Second page text"], title="Two pages")
    inline = read_pdf_of(pdf, None, True)
    assert await pool.run(read_pdf_of, pdf, None, True) == inline
    with pytest.raises(DocumentError) as info:  # comes back as itself, code and status kept
        await pool.run(read_pdf_of, b"", None, True)
    assert (info.value.code, info.value.status) == (DocumentError.empty().code, 400)
    reader = DocumentReader()
    alone = await reader.parse(pdf, "pdf", PLAN, retain=True)
    reader.pool = pool
    calls = pool.status()["calls"]
    assert await reader.parse(pdf, "pdf", PLAN, retain=True) == alone
    assert pool.status()["calls"] == calls + 1  # the text layer was read in a worker


async def test_a_lost_pdf_worker_fails_the_file() -> None:
    class Lost:
        async def run(self, *args: Any) -> Any:
            raise WorkerLost("gone")

    reader = DocumentReader()
    reader.pool = Lost()  # type: ignore[assignment]
    with pytest.raises(DocumentError) as info:
        await reader.parse(make_pdf(["x"]), "pdf", PLAN, retain=True)
    assert info.value.code == "SCRAPE_ALL_ENGINES_FAILED"
