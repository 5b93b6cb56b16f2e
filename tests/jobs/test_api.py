"""The jobs API and /status, /metrics through a whole daemon (default installers, real HTTP)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import trio

from daemon.app import Daemon
from daemon.config import WebhookSpec
from daemon.fakes.receiver import WebhookReceiver
from daemon.jobs import store as jobstore
from daemon.jobs.manager import JobManager
from tests.conftest import serve_daemon
from tests.jobs.conftest import SECRET_ENV

CONFIG = f"""
[daemon]
state_dir = "state"
[crawl.browser]
enabled = false
[http]
bind = "127.0.0.1:0"
[collector]
enabled = false
[webhooks]
secret_env = "{SECRET_ENV}"
timeout = "10s"
retry_schedule = ["10ms", "20ms"]
allow_cidrs = ["127.0.0.0/8"]
"""

UNKNOWN = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
async def daemon(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Daemon]:
    path = tmp_path / "crawld.toml"
    path.write_text(CONFIG)
    running = await serve_daemon(nursery, path)
    yield running
    running.request_stop()


@pytest.fixture
async def client(daemon: Daemon) -> AsyncIterator[httpx.AsyncClient]:
    assert daemon.http_address is not None
    host, port = daemon.http_address
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", trust_env=False) as c:
        yield c


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


async def test_status_paginates_rows_with_absolute_next_links(
    daemon: Daemon, client: httpx.AsyncClient
) -> None:
    jobs: JobManager = daemon.jobs
    job = await jobs.create_job("crawl", webhook=None, source={"task_id": "t"})
    for start in (0, 10, 20):
        await jobs.page(job, [{"n": n} for n in range(start, min(start + 10, 25))])

    body = (await client.get(f"/v2/crawl/{job}")).json()
    assert list(body) == [
        "success",
        "status",
        "completed",
        "total",
        "creditsUsed",
        "createdAt",
        "expiresAt",
        "data",
    ]  # fmt: skip  (no completedAt while running, no next when everything fits)
    assert (body["success"], body["status"], body["completed"], body["total"]) == (
        True, "scraping", 25, 25,
    )  # fmt: skip
    assert [r["n"] for r in body["data"]] == list(range(25))
    assert body["createdAt"].endswith("Z")
    assert ms(body["expiresAt"]) - ms(body["createdAt"]) == 86_400_000

    base = str(client.base_url).rstrip("/")
    rows, url, pages = [], f"{base}/v2/crawl/{job}?limit=10", 0
    while url:
        page = (await client.get(url)).json()
        rows += [r["n"] for r in page["data"]]
        url, pages = page.get("next"), pages + 1
        if url:
            parts = urlsplit(url)
            assert f"{parts.scheme}://{parts.netloc}" == base
            assert parse_qs(parts.query)["limit"] == ["10"]
    assert (rows, pages) == (list(range(25)), 3)

    await jobs.finish(job, "completed")
    done = (await client.get(f"/v2/crawl/{job}", params={"skip": 24})).json()
    assert done["status"] == "completed" and [r["n"] for r in done["data"]] == [24]
    assert ms(done["expiresAt"]) - ms(done["completedAt"]) == 86_400_000
    elapsed = ms(done["completedAt"]) - ms(done["createdAt"])
    assert done["duration"] == round(elapsed / 1000, 3) and "duration" not in body


async def test_any_positive_limit_is_taken_and_a_page_stops_at_10_mib(
    daemon: Daemon, client: httpx.AsyncClient
) -> None:
    # Firecrawl takes any positive `limit` (the SDKs and Firecrawl's tests ask for 10000) and
    # bounds each answer by size instead: 10 MiB of documents, then `next`.
    jobs: JobManager = daemon.jobs
    job = await jobs.create_job("crawl", webhook=None, source={})
    await jobs.page(job, [{"n": n, "pad": "x" * 1_500_000} for n in range(10)])
    first = await client.get(f"/v2/crawl/{job}", params={"limit": 10000})
    assert first.status_code == 200, first.text
    body = first.json()
    assert [r["n"] for r in body["data"]] == list(range(6))  # 6 x 1.5 MB fit in 10 MiB, 7 do not
    assert parse_qs(urlsplit(body["next"]).query) == {"skip": ["6"], "limit": ["10000"]}
    rest = (await client.get(body["next"])).json()
    assert [r["n"] for r in rest["data"]] == list(range(6, 10)) and "next" not in rest
    big = await client.get(f"/v2/crawl/{job}", params={"limit": 2**40, "skip": 9})
    assert [r["n"] for r in big.json()["data"]] == [9]


@pytest.mark.parametrize(
    ("method", "path", "status", "error"),
    [
        ("GET", f"/v2/crawl/{UNKNOWN}", 404, "Job not found"),
        ("GET", f"/v2/crawl/{UNKNOWN}/errors", 404, "Job not found"),
        ("DELETE", f"/v2/crawl/{UNKNOWN}", 404, "Job not found"),
        ("GET", "/v2/crawl/not-a-uuid", 400, "invalid job id: expected a UUID"),
        ("DELETE", "/v2/crawl/not-a-uuid", 400, "invalid job id: expected a UUID"),
        ("GET", f"/v2/crawl/{UNKNOWN}?skip=-1", 400, "query parameter 'skip' must be between"),
        ("GET", f"/v2/crawl/{UNKNOWN}?limit=0", 400, "query parameter 'limit' must be between"),
        ("GET", f"/v2/crawl/{UNKNOWN}?limit=x", 400, "query parameter 'limit' must be an integer"),
    ],
)
async def test_unknown_and_malformed_requests(
    client: httpx.AsyncClient, method: str, path: str, status: int, error: str
) -> None:
    response = await client.request(method, path)
    assert response.status_code == status
    assert response.json()["error"].startswith(error)
    if status == 404:
        assert response.json() == {"success": False, "error": "Job not found"}


async def test_delete_cancels_running_jobs_and_refuses_finished_ones(
    daemon: Daemon, client: httpx.AsyncClient
) -> None:
    jobs: JobManager = daemon.jobs
    job = await jobs.create_job("crawl", webhook=None, source={})
    stop = jobs.cancel_requested(job)
    response = await client.delete(f"/v2/crawl/{job}")
    assert (response.status_code, response.json()) == (200, {"status": "cancelled"})
    assert stop.is_set()  # the producer stops between windows, then finishes the job
    await jobs.finish(job, "cancelled")
    assert (await client.get(f"/v2/crawl/{job}")).json()["status"] == "cancelled"
    again = await client.delete(f"/v2/crawl/{job}")
    assert (again.status_code, again.json()) == (
        409, {"success": False, "error": "Job is already cancelled"},
    )  # fmt: skip

    assert daemon.store is not None
    orphan = "33333333-3333-4333-8333-333333333333"  # running, left by an earlier process
    await daemon.store.write(
        lambda c: jobstore.insert_job(
            c, job_id=orphan, kind="crawl", webhook=None, source={}, at_ms=1, expires_ms=2
        )
    )
    assert (await client.delete(f"/v2/crawl/{orphan}")).status_code == 200
    assert (await client.get(f"/v2/crawl/{orphan}")).json()["status"] == "cancelled"


async def test_errors_list_dead_letters_and_producer_errors(
    daemon: Daemon, client: httpx.AsyncClient, rx: WebhookReceiver
) -> None:
    jobs: JobManager = daemon.jobs
    rx.fail_next(3, 503)  # the started event exhausts its two retries (set before it can go)
    job = await jobs.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
    await jobs.add_error(job, "UPSTREAM", "window 3 failed", url="https://openapi.example/3")
    await jobs.finish(job, "completed")
    with trio.fail_after(5):
        await jobs.wait_drained(job)

    body = (await client.get(f"/v2/crawl/{job}/errors")).json()
    assert body["robotsBlocked"] == []
    first, second = body["errors"]
    assert (first["code"], first["error"], first["url"]) == (
        "UPSTREAM", "window 3 failed", "https://openapi.example/3",
    )  # fmt: skip
    assert (second["code"], second["url"]) == ("WEBHOOK_FAILED", rx.url())
    assert second["error"] == (
        f"webhook event {job}:1 (crawl.started) was not delivered: "
        "gave up after 3 attempts; last: HTTP 503"
    )
    assert second["timestamp"].endswith("Z") and len(second["id"]) == 36
    assert [r.seq for r in rx.events(job)] == [2]  # the terminal still went out, last


async def test_status_metrics_and_openapi(
    daemon: Daemon, client: httpx.AsyncClient, rx: WebhookReceiver
) -> None:
    jobs: JobManager = daemon.jobs
    job = await jobs.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
    await jobs.finish(job, "completed")
    with trio.fail_after(5):
        await jobs.wait_drained(job)
    status = (await client.get("/status")).json()
    section = status["webhooks"]
    assert section["store"] is True and section["degraded_jobs"] == 0
    assert section["outcomes"]["delivered"] == 2 and section["pending_events"] == 0
    components = {c["name"]: c["state"] for c in status["components"]}
    assert components["webhooks"] == components["jobs-cleanup"] == "running"
    text = (await client.get("/metrics")).text
    for outcome in ("delivered", "failed", "blocked", "degraded", "dropped"):
        assert f'crawld_webhook_events_total{{outcome="{outcome}"}}' in text
    assert "crawld_webhook_oldest_pending_seconds" in text
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert {"get", "delete"} <= set(paths["/v2/crawl/{id}"])
    assert "get" in paths["/v2/crawl/{id}/errors"]


async def test_reload_applies_new_webhook_settings(daemon: Daemon, tmp_path: Path) -> None:
    path = tmp_path / "crawld.toml"
    path.write_text(CONFIG.replace('timeout = "10s"', 'timeout = "3s"'))
    assert await daemon.reload()
    assert daemon.jobs.deliverer.settings.timeout == 3.0
