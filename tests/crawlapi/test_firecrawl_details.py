"""Firecrawl's request and status details through the whole daemon over real HTTP: what
Firecrawl's own server accepts or refuses and the fields its clients read."""

from __future__ import annotations

import re

import httpx
import pytest
import trio

from daemon.fakes.site import SiteSim

from .conftest import wait_finished


@pytest.mark.parametrize(
    ("path", "extra"),
    [("/v2/crawl", {"limit": 1}), ("/v2/batch/scrape", {})],
)
async def test_a_webhook_header_that_cannot_be_sent_is_refused_naming_it(
    client: httpx.AsyncClient, site: SiteSim, path: str, extra: dict[str, object]
) -> None:
    # httpx sends header values as ASCII: `café` passed a latin-1 check, then every delivery
    # of the job failed with UnicodeEncodeError. It is refused before a job exists.
    body = {
        "webhook": {"url": "http://127.0.0.1:9/hook", "headers": {"X-Team": "caf\u00e9"}},
        **extra,
    }
    body["url" if path == "/v2/crawl" else "urls"] = (
        site.url("/") if path == "/v2/crawl" else [site.url("/")]
    )
    answer = await client.post(path, json=body)
    assert answer.status_code == 400, answer.text
    [problem] = answer.json()["details"]
    assert problem["path"] == "$.webhook"
    assert "'X-Team' contains a character outside ASCII" in problem["message"]
    assert "caf" not in problem["message"]  # a header value may be a credential


@pytest.mark.parametrize("authorization", ["Bearer None", "Bearer anything", "Basic eA=="])
async def test_without_a_key_any_authorization_is_accepted(
    client: httpx.AsyncClient, authorization: str
) -> None:
    # Dify sends `Bearer None` when no key is set; old SDKs need some key.
    answer = await client.get("/v2/crawl/active", headers={"Authorization": authorization})
    assert (answer.status_code, answer.json()) == (200, {"success": True, "crawls": []})


async def test_origin_and_integration_are_taken_as_firecrawl_takes_them(
    client: httpx.AsyncClient, site: SiteSim
) -> None:
    for integration in ("dify", "n8n", "_my-tool"):
        answer = await client.post("/v2/scrape", json={
            "url": site.url("/about"), "origin": "js-sdk@4.42.0", "integration": integration})  # fmt: skip
        assert answer.status_code == 200, answer.text
    for path, body in [
        ("/v2/scrape", {"url": site.url("/about")}),
        ("/v2/crawl", {"url": site.url("/about"), "limit": 1}),
        ("/v2/batch/scrape", {"urls": [site.url("/about")]}),
        ("/v2/map", {"url": site.url("/about")}),
    ]:
        answer = await client.post(path, json={**body, "integration": "my-tool"})
        assert answer.status_code == 400, (path, answer.text)
        [problem] = answer.json()["details"]
        assert problem["path"] == "$.integration"
        assert problem["message"].startswith("Invalid enum value. Expected 'dify' | 'zapier'")
        answer = await client.post(path, json={**body, "origin": 5})
        assert answer.status_code == 400 and answer.json()["details"][0]["path"] == "$.origin"


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        ("/v2/scrape", {"waitFor": 3000, "timeout": 5000}, "$.waitFor"),
        ("/v2/batch/scrape", {"waitFor": 3000, "timeout": 5000}, "$.waitFor"),
        ("/v2/crawl", {"scrapeOptions": {"waitFor": 3000, "timeout": 5000}},
         "$.scrapeOptions.waitFor"),
    ],
)  # fmt: skip
async def test_wait_for_above_half_the_timeout_is_refused(
    client: httpx.AsyncClient, site: SiteSim, path: str, body: dict[str, object], where: str
) -> None:
    target = {"urls": [site.url("/")]} if path == "/v2/batch/scrape" else {"url": site.url("/")}
    answer = await client.post(path, json={**target, **body})
    assert answer.status_code == 400
    assert answer.json()["details"] == [
        {"path": where, "message": "waitFor must not exceed half of timeout"}
    ]
    half = await client.post("/v2/scrape", json={"url": site.url("/about"), "waitFor": 2500,
                                                 "timeout": 5000})  # fmt: skip
    assert half.status_code == 200 and "waitFor is ignored" in half.json()["warning"]


async def test_ongoing_created_at_is_iso_8601_with_milliseconds(
    client: httpx.AsyncClient, site: SiteSim
) -> None:
    site.slow_seconds = 30
    started = (await client.post("/v2/crawl", json={"url": site.url("/slow"),
                                                    "sitemap": "skip"})).json()  # fmt: skip
    [crawl] = (await client.get("/v2/crawl/ongoing")).json()["crawls"]
    assert crawl["id"] == started["id"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", crawl["created_at"])
    await client.delete(f"/v2/crawl/{started['id']}")


async def test_a_finished_crawl_with_robots_blocked_pages_warns_in_firecrawls_words(
    client: httpx.AsyncClient, site: SiteSim
) -> None:
    started = (await client.post("/v2/crawl", json={
        "url": site.url("/"), "sitemap": "skip", "maxDiscoveryDepth": 1,
        "includePaths": ["^/private/", "^/about$"]})).json()  # fmt: skip
    assert await wait_finished(client, started["id"]) == "completed"
    status = (await client.get(f"/v2/crawl/{started['id']}")).json()
    assert status["warning"] == (
        "One or more pages were unable to be crawled because the robots.txt file prevented"
        " this. Please use the /scrape endpoint instead."
    )
    errors = (await client.get(f"/v2/crawl/{started['id']}/errors")).json()
    assert site.url("/private/secret") in errors["robotsBlocked"]
    clean = (await client.post("/v2/crawl", json={"url": site.url("/about"),
                                                  "sitemap": "skip"})).json()  # fmt: skip
    assert await wait_finished(client, clean["id"]) == "completed"
    assert "warning" not in (await client.get(f"/v2/crawl/{clean['id']}")).json()


async def test_credit_and_token_usage_answer_as_a_self_hosted_firecrawl(
    client: httpx.AsyncClient,
) -> None:
    credits = await client.get("/v2/team/credit-usage")
    assert credits.json() == {"success": True, "data": {"remainingCredits": 99_999_999}}
    tokens = (await client.get("/v2/team/token-usage")).json()
    start = tokens["data"].pop("billingPeriodStart")  # the daemon's start: tokens count from it
    assert start.endswith("Z")
    assert tokens == {"success": True, "data": {"remainingTokens": 99_999_999, "tokensUsed": 0,
                                                "providers": {}}}  # fmt: skip


async def test_queue_status_and_concurrency_count_real_pages_and_jobs(
    client: httpx.AsyncClient, site: SiteSim
) -> None:
    idle = (await client.get("/v2/team/queue-status")).json()
    assert idle == {"success": True, "jobsInQueue": 0, "activeJobsInQueue": 0,
                    "waitingJobsInQueue": 0, "maxConcurrency": 8, "mostRecentSuccess": None,
                    "runningCrawls": 0, "waitingCrawls": 0}  # fmt: skip
    assert (await client.get("/v2/concurrency-check")).json() == {
        "success": True, "concurrency": 0, "maxConcurrency": 8}  # fmt: skip
    site.slow_seconds = 30
    urls = [site.url(f"/slow?n={n}") for n in range(3)]
    batch = (await client.post("/v2/batch/scrape", json={"urls": urls,
                                                         "maxConcurrency": 1})).json()  # fmt: skip
    with trio.fail_after(10):
        while (queue := (await client.get("/v2/team/queue-status")).json())[
            "activeJobsInQueue"
        ] < 1:
            await trio.sleep(0.01)
    assert (queue["jobsInQueue"], queue["activeJobsInQueue"], queue["waitingJobsInQueue"]) == (
        3, 1, 2)  # fmt: skip
    assert (queue["runningCrawls"], queue["waitingCrawls"]) == (1, 0)
    busy = (await client.get("/v2/concurrency-check")).json()
    assert (busy["concurrency"], busy["maxConcurrency"]) == (1, 8)
    await client.delete(f"/v2/batch/scrape/{batch['id']}")
    assert await wait_finished(client, batch["id"], "batch") == "cancelled"
    site.slow_seconds = 0
    assert (await client.post("/v2/scrape", json={"url": site.url("/about")})).status_code == 200
    done = (await client.get("/v2/team/queue-status")).json()
    assert (done["jobsInQueue"], done["runningCrawls"]) == (0, 0)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", done["mostRecentSuccess"])
