"""`next` links come from the configured base URL, never from the Host header; a client that
goes away is logged at debug, not as an error with a traceback (issue 7, findings 10 and 11)."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import pytest
import trio

from tests.api.conftest import StartDaemon, client


async def page_link(start_daemon: StartDaemon, http: str, host: str | None) -> str:
    daemon = await start_daemon(http)
    job = await daemon.jobs.create_job("crawl", webhook=None, source={})
    await daemon.jobs.page(job, [{"n": n} for n in range(5)])
    headers = {"Host": host} if host else {}
    async with client(daemon) as c:
        r = await c.get(f"/v2/crawl/{job}", params={"limit": 2}, headers=headers)
    assert r.status_code == 200, r.text
    link: str = r.json()["next"]
    return link


async def test_next_links_ignore_the_host_header(start_daemon: StartDaemon) -> None:
    link = await page_link(start_daemon, "", "localhost")
    parts = urlsplit(link)
    assert parts.hostname == "127.0.0.1" and parts.port not in (None, 0)
    assert parts.query == "limit=2&skip=2"


async def test_next_links_use_public_url(start_daemon: StartDaemon) -> None:
    link = await page_link(
        start_daemon, 'public_url = "https://crawld.example/api/"\nhosts = ["*"]', "evil.example"
    )
    assert link.startswith("https://crawld.example/api/v2/crawl/")
    assert link.endswith("?limit=2&skip=2")


async def test_a_client_leaving_mid_body_is_logged_at_debug(
    start_daemon: StartDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = await start_daemon()
    assert daemon.http_address is not None
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        stream = await trio.open_tcp_stream(*daemon.http_address)
        head = (
            f"POST /crawl/stop HTTP/1.1\r\nHost: 127.0.0.1:{daemon.http_address[1]}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        await stream.send_all(head.encode())
        await stream.aclose()
    with trio.fail_after(10):
        while not any("client disconnected" in r.getMessage() for r in caplog.records):
            await trio.sleep(0.01)
    async with client(daemon) as c:  # the daemon is fine
        assert (await c.get("/healthz")).status_code == 200
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == [], [r.getMessage() for r in loud]
    assert all(r.exc_info is None for r in caplog.records if "disconnect" in r.getMessage())
