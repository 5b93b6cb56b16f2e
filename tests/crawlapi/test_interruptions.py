"""A store failure (a connection lost while COMMIT was in flight, a reader timing out) or a lost
lease in the middle of a crawl or batch job interrupts its work and never ends it: the job goes
on under its id from what was committed, its webhook stream has one `started` and one terminal
`completed`. Any other error still fails the job (an internal error is no interruption)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import psycopg_pool
import pytest
import trio

from daemon.app import Daemon
from daemon.cluster import LeaseLost
from daemon.crawl.runs import crawler
from daemon.crawl.runs import store as crawlstore
from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.site import SiteSim
from daemon.jobs.events import CANCELLED_BY_USER
from tests.conftest import unlabelled

from .conftest import wait_finished


def fail_once_at(
    monkeypatch: pytest.MonkeyPatch, name: str, call: int, error: BaseException
) -> Counter[str]:
    """Make the `call`-th call of crawlstore.`name` raise `error` (once); returns the counts."""
    calls: Counter[str] = Counter()
    real: Callable[..., Any] = getattr(crawlstore, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        if calls[name] == call:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(crawlstore, name, wrapped)
    return calls


@pytest.fixture(autouse=True)
def short_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crawler, "INTERRUPTED_PAUSE_S", 0.01)


def lost_commit() -> psycopg.OperationalError:
    return psycopg.OperationalError("consuming input failed: server closed the connection")


async def _crawl(client: httpx.AsyncClient, site: SiteSim, rx: WebhookReceiver) -> str:
    body = {"url": site.url("/pages/0"), "sitemap": "include", "crawlEntireDomain": True,
            "includePaths": ["^/pages/"], "limit": 40, "webhook": {"url": rx.url()}}  # fmt: skip
    answer = await client.post("/v2/crawl", json=body)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


async def _documents(client: httpx.AsyncClient, path: str) -> list[str]:
    urls: list[str] = []
    url: str | None = path
    while url is not None:
        page = (await client.get(url)).json()
        urls += [d["metadata"]["sourceURL"] for d in page["data"]]
        url = page.get("next")
    return urls


async def _stream(rx: WebhookReceiver, job_id: str, kind: str) -> list[str | None]:
    with trio.fail_after(30):
        await rx.wait_until(
            lambda: any(
                (e.type or "").endswith((".completed", ".failed")) for e in rx.events(job_id)
            )
        )
    assert rx.violations == []
    seqs = sorted(set(rx.seqs(job_id)))
    assert seqs == list(range(1, len(seqs) + 1))
    first = {e.seq: e.type for e in reversed(rx.events(job_id))}
    return [first[s] for s in seqs]


@pytest.mark.parametrize(
    ("name", "call", "error"),
    [
        ("claim", 3, lost_commit()),  # a worker's claim: the COMMIT's outcome is unknown
        ("set_kicked_off", 1, lost_commit()),  # the kickoff
        ("kicked_off", 1, psycopg_pool.PoolTimeout("couldn't get a connection")),  # a read
        ("conclude", 1, lost_commit()),  # deciding the end
        ("claim", 2, LeaseLost("crawl:x")),  # fenced out (a paused owner woke up)
        ("release_claims", 1, lost_commit()),  # starting over
    ],
)
async def test_a_store_failure_interrupts_a_crawl_and_it_goes_on(
    client: httpx.AsyncClient,
    site: SiteSim,
    rx: WebhookReceiver,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    call: int,
    error: BaseException,
) -> None:
    calls = fail_once_at(monkeypatch, name, call, error)
    job_id = await _crawl(client, site, rx)
    assert await wait_finished(client, job_id) == "completed"
    assert calls[name] > call, "the failure was never injected"
    docs = await _documents(client, f"/v2/crawl/{job_id}")
    assert len(docs) == len(set(docs)) == 40
    types = await _stream(rx, job_id, "crawl")
    assert types[0] == "crawl.started" and types[-1] == "crawl.completed"
    assert types.count("crawl.started") == 1 and types.count("crawl.page") == 40
    assert not any(t and t.endswith(".failed") for t in types)
    metrics = unlabelled((await client.get("/metrics")).text)
    if os.environ.get("CRAWLD_TEST_STORE") != "postgres":
        # On PostgreSQL the store settles a lost COMMIT itself, so the crawl may never see it.
        assert 'crawld_crawl_interruptions_total{kind="crawl"}' in metrics


async def test_a_store_failure_interrupts_a_batch_and_it_goes_on(
    client: httpx.AsyncClient, site: SiteSim, rx: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fail_once_at(monkeypatch, "claim", 2, lost_commit())
    urls = [site.url(f"/pages/{i}") for i in range(30)]
    answer = await client.post("/v2/batch/scrape", json={"urls": urls,
                                                          "webhook": {"url": rx.url()}})  # fmt: skip
    job_id = answer.json()["id"]
    assert await wait_finished(client, job_id, "batch") == "completed"
    assert calls["claim"] > 2
    docs = await _documents(client, f"/v2/batch/scrape/{job_id}")
    assert Counter(docs) == Counter(urls)
    types = await _stream(rx, job_id, "batch_scrape")
    assert types[0] == "batch_scrape.started" and types[-1] == "batch_scrape.completed"
    assert types.count("batch_scrape.started") == 1 and types.count("batch_scrape.page") == 30


async def test_an_internal_error_still_fails_the_job(
    client: httpx.AsyncClient, site: SiteSim, rx: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_once_at(monkeypatch, "claim", 2, RuntimeError("a bug"))
    job_id = await _crawl(client, site, rx)
    assert await wait_finished(client, job_id) == "failed"
    types = await _stream(rx, job_id, "crawl")
    assert types[-1] == "crawl.failed" and types.count("crawl.failed") == 1
    assert rx.events(job_id)[-1].event["error"] == "internal error: RuntimeError"


async def test_only_a_delete_cancels_and_the_stored_error_says_so(
    daemon: Daemon, client: httpx.AsyncClient, site: SiteSim, rx: WebhookReceiver
) -> None:
    site.slow_seconds = 30
    body = {"url": site.url("/slow"), "webhook": {"url": rx.url()}}
    job_id = (await client.post("/v2/crawl", json=body)).json()["id"]
    assert (await client.delete(f"/v2/crawl/{job_id}")).status_code == 200
    assert await wait_finished(client, job_id) == "cancelled"
    assert daemon.jobs is not None
    record = await daemon.jobs.get_job(job_id)
    assert record is not None and record.error == CANCELLED_BY_USER
    types = await _stream(rx, job_id, "crawl")
    assert types[-1] == "crawl.failed" and rx.events(job_id)[-1].event["error"] == "cancelled"
