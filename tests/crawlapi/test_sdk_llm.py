"""The json and summary formats through firecrawl-py on scrape, crawl and batch, against the
OpenAI-compatible simulator: the right page text reaches the model, answers land in the
documents, the cache answers repeats, tokens are counted, and every fault of the endpoint ends
as a per-page warning on a finished job (never a stuck job, never a 500)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio
from firecrawl import Firecrawl
from firecrawl.v2.types import JsonFormat, ScrapeOptions
from pydantic import BaseModel

from daemon.app import Daemon
from daemon.fakes.openai_compat import OpenAICompatService, serve_openai_compat
from daemon.fakes.site import SiteSim
from tests.conftest import unlabelled

from .conftest import CONFIG, wait_finished

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}


class Product(BaseModel):
    title: str
    words: int


@pytest.fixture
async def llm_sim(nursery: trio.Nursery) -> AsyncIterator[tuple[OpenAICompatService, str]]:
    service = OpenAICompatService()
    stop = trio.Event()
    host, port = await nursery.start(
        functools.partial(serve_openai_compat, service, "127.0.0.1:0", shutdown=stop)
    )
    yield service, f"http://{host}:{port}/v1"
    stop.set()


@pytest.fixture
def crawl_config(llm_sim: tuple[OpenAICompatService, str]) -> str:
    return CONFIG + (
        f'[llm]\nbase_url = "{llm_sim[1]}"\nmodel = "sim-model"\ntimeout = "2s"\n'
        'max_concurrency = 3\nretries = 2\nretry_backoff_max = "50ms"\n'
    )


@pytest.fixture
def sim(llm_sim: tuple[OpenAICompatService, str]) -> OpenAICompatService:
    return llm_sim[0]


def pages_sent(sim: OpenAICompatService) -> list[str]:
    return [r["messages"][-1]["content"].split("Page content:\n", 1)[1] for r in sim.requests]


async def test_scrape_json_and_summary(fc: Firecrawl, sdk: Any, site: SiteSim,
                                       sim: OpenAICompatService) -> None:  # fmt: skip
    doc = await sdk(fc.scrape, site.url("/pages/3"),
                    formats=[JsonFormat(schema=Product, prompt="the page"), "summary"])  # fmt: skip
    assert doc.json["title"] == "Page 3" and doc.json["words"] > 20
    assert doc.summary.startswith("Summary of Page 3:")
    assert doc.markdown is None  # the model read it; it was not asked for
    assert len(sim.requests) == 2
    assert all(text.startswith("# Page 3") for text in pages_sent(sim))
    assert any(r.get("response_format", {}).get("type") == "json_schema" for r in sim.requests)
    again = await sdk(fc.scrape, site.url("/pages/3"),
                      formats=["markdown", JsonFormat(schema=Product, prompt="the page")])  # fmt: skip
    assert again.json == doc.json and again.markdown.startswith("# Page 3")
    assert len(sim.requests) == 2  # served from the cache


async def test_crawl_pages_each_get_their_own_json(fc: Firecrawl, sdk: Any, site: SiteSim,
                                                   sim: OpenAICompatService) -> None:  # fmt: skip
    job = await sdk(fc.crawl, site.url("/pages/0"), limit=7, include_paths=["^/pages/\\d+$"],
                    crawl_entire_domain=True, poll_interval=1,
                    scrape_options=ScrapeOptions(formats=["markdown", JsonFormat(schema=SCHEMA),
                                                          "summary"]))  # fmt: skip
    assert job.status == "completed" and len(job.data) == 7
    for doc in job.data:
        title = doc.markdown.splitlines()[0].lstrip("# ")
        assert doc.json == {"title": title}
        assert doc.summary.startswith(f"Summary of {title}:")
    assert sim.max_in_flight <= 3
    assert len(sim.requests) == 14
    assert sorted(t.splitlines()[0] for t in pages_sent(sim)) == sorted(
        d.markdown.splitlines()[0] for d in job.data for _ in range(2)
    )


async def test_batch_through_the_sdk(fc: Firecrawl, sdk: Any, site: SiteSim,
                                     sim: OpenAICompatService) -> None:  # fmt: skip
    urls = [site.url(f"/pages/{i}") for i in (4, 5, 6)]
    job = await sdk(fc.batch_scrape, urls, formats=["summary", JsonFormat(schema=Product)],
                    poll_interval=1)  # fmt: skip
    assert job.status == "completed" and len(job.data) == 3
    assert sorted(d.summary.split(":")[0] for d in job.data) == [
        "Summary of Page 4", "Summary of Page 5", "Summary of Page 6"]  # fmt: skip
    assert sorted(d.json["title"] for d in job.data) == ["Page 4", "Page 5", "Page 6"]
    assert all(d.markdown is None for d in job.data)


@pytest.mark.parametrize(
    ("fmt", "path", "message"),
    [
        ({"type": "json", "schema": {"type": "object", "additionalProperties": True}},
         "$.formats[0].schema", "schema-less dictionary"),
        ({"type": "json", "schema": {"type": "wrong"}}, "$.formats[0].schema", "Invalid JSON"),
        ({"type": "json", "schema": []}, "$.formats[0].schema", "JSON Schema object"),
        ({"type": "json", "prompt": "x" * 10_001}, "$.formats[0].prompt", "10000"),
        ({"type": "json", "colour": 1}, "$.formats[0].colour", "unrecognized key"),
        ({"type": "summary", "provider": "nope"}, "$.formats[0].provider", "no [llm.providers]"),
    ],
)  # fmt: skip
async def test_bad_formats_are_400(client: httpx.AsyncClient, site: SiteSim,
                                   fmt: dict[str, Any], path: str, message: str) -> None:  # fmt: skip
    for route, body in (("/v2/scrape", {"url": site.url("/pages/1"), "formats": [fmt]}),
                        ("/v2/batch/scrape", {"urls": [site.url("/pages/1")], "formats": [fmt]}),
                        ("/v2/crawl", {"url": site.url("/"), "scrapeOptions": {"formats": [fmt]}})):  # fmt: skip
        answer = await client.post(route, json=body)
        assert answer.status_code == 400, (route, answer.text)
        details = answer.json()["details"]
        where = path if route != "/v2/crawl" else path.replace("$.", "$.scrapeOptions.")
        assert any(d["path"] == where and message in d["message"] for d in details), details


async def test_schema_accepted_is_normalised(client: httpx.AsyncClient, site: SiteSim) -> None:
    schema = {"type": "object", "properties": {"title": {"type": "string"}},
              "required": ["title", "ghost"], "additionalProperties": True}  # fmt: skip
    answer = await client.post("/v2/scrape", json={
        "url": site.url("/pages/2"), "formats": [{"type": "json", "schema": schema,
                                                  "checkPromptInjection": None}]})  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"]["json"] == {"title": "Page 2"}


@pytest.mark.parametrize("fault", ["429 storm", "timeouts", "invalid JSON twice", "server down",
                                   "500s"])  # fmt: skip
async def test_faults_end_as_page_warnings(client: httpx.AsyncClient, site: SiteSim,
                                           sim: OpenAICompatService, daemon: Daemon,
                                           fault: str) -> None:  # fmt: skip
    code = {"429 storm": "LLM_RATE_LIMITED", "timeouts": "LLM_TIMEOUT", "500s": "LLM_UNAVAILABLE",
            "invalid JSON twice": "LLM_BAD_OUTPUT", "server down": "LLM_UNAVAILABLE"}[fault]  # fmt: skip
    pages = 4
    if fault == "429 storm":
        sim.rate_limit(1000, retry_after=0.01)
    elif fault == "timeouts":
        sim.slow(1000, seconds=3)
    elif fault == "500s":
        sim.fail(1000, 503)
    elif fault == "invalid JSON twice":
        sim.invalid_json(2 * pages)
    else:
        llm = daemon.llm
        down = llm.config.__class__(**{**{f: getattr(llm.config, f) for f in
                                          llm.config.__struct_fields__},
                                       "base_url": "http://127.0.0.1:9/v1"})  # fmt: skip
        llm.configure(down)
    urls = [site.url(f"/pages/{i}") for i in range(10, 10 + pages)]
    start = await client.post("/v2/batch/scrape", json={
        "urls": urls, "formats": ["markdown", {"type": "json", "schema": SCHEMA}]})  # fmt: skip
    job = start.json()["id"]
    with trio.fail_after(20):
        assert await wait_finished(client, job, "batch") == "completed"
    data = (await client.get(f"/v2/batch/scrape/{job}")).json()["data"]
    assert len(data) == pages
    for doc in data:
        assert "json" not in doc and doc["markdown"].startswith("# Page")
        assert doc["warning"].startswith(f"JSON extraction failed: {code}"), doc["warning"]
    scrape = await client.post("/v2/scrape", json={"url": site.url("/pages/30"),
                                                   "formats": ["summary"]})  # fmt: skip
    assert scrape.status_code == 200
    if fault != "invalid JSON twice":  # a summary is plain text: nothing to be invalid
        assert scrape.json()["data"]["warning"].startswith(f"Summary failed: {code}")


async def test_retry_after_honoured_then_success(client: httpx.AsyncClient, site: SiteSim,
                                                 sim: OpenAICompatService) -> None:  # fmt: skip
    sim.rate_limit(2, retry_after=0.05)
    answer = await client.post("/v2/scrape", json={"url": site.url("/pages/8"),
                                                   "formats": ["summary"]})  # fmt: skip
    assert answer.json()["data"]["summary"].startswith("Summary of Page 8")
    assert len(sim.requests) == 3


def sample(text: str, line: str) -> float:
    """The value of a /metrics sample (0 when absent); the registry is the process's, shared by
    every daemon of the test session."""
    for row in unlabelled(text).splitlines():
        if row.startswith(line + " "):
            return float(row.rsplit(" ", 1)[1])
    return 0.0


async def test_token_usage_and_metrics(fc: Firecrawl, sdk: Any, client: httpx.AsyncClient,
                                       site: SiteSim, sim: OpenAICompatService) -> None:  # fmt: skip
    ok = 'crawld_llm_requests_total{outcome="ok",provider="default"}'
    tokens_in = 'crawld_llm_tokens_total{direction="in",provider="default"}'
    before = (await client.get("/metrics")).text
    await sdk(fc.scrape, site.url("/pages/9"), formats=["summary"])
    usage = (await client.get("/v2/team/token-usage")).json()["data"]
    sent = sim.requests[-1]
    assert usage["providers"]["default"]["requests"] == 1
    assert usage["providers"]["default"]["model"] == "sim-model"
    assert usage["tokensUsed"] == usage["providers"]["default"]["totalTokens"] > 0
    assert usage["remainingTokens"] == 99_999_999 and usage["billingPeriodStart"]
    assert sent["model"] == "sim-model"
    tokens = await sdk(fc.get_token_usage)
    assert tokens.remaining_tokens == 99_999_999
    after = (await client.get("/metrics")).text
    assert sample(after, ok) - sample(before, ok) == 1
    prompt = usage["providers"]["default"]["promptTokens"]
    assert sample(after, tokens_in) - sample(before, tokens_in) == prompt


async def test_reload_removes_and_adds_llm(client: httpx.AsyncClient, site: SiteSim,
                                           daemon: Daemon, crawl_config: str) -> None:  # fmt: skip
    body = {"url": site.url("/pages/5"), "formats": ["summary"]}
    path = trio.Path(daemon.config.source)
    await path.write_text(CONFIG)
    assert await daemon.reload()
    answer = await client.post("/v2/scrape", json=body)
    assert answer.status_code == 400 and "needs an LLM" in answer.text
    # a key variable that is not set: the reload changes nothing
    await path.write_text(crawl_config + 'api_key_env = "CRAWLD_TEST_UNSET_LLM_KEY"\n')
    assert not await daemon.reload()
    assert "CRAWLD_TEST_UNSET_LLM_KEY" in daemon.last_reload.message  # type: ignore[union-attr]
    assert (await client.post("/v2/scrape", json=body)).status_code == 400
    await path.write_text(crawl_config)
    assert await daemon.reload()
    answer = await client.post("/v2/scrape", json=body)
    assert answer.status_code == 200 and answer.json()["data"]["summary"].startswith("Summary")
    status = (await client.get("/status")).json()
    assert status["llm"]["providers"]["default"]["model"] == "sim-model"


async def test_v1_extract_and_json(client: httpx.AsyncClient, site: SiteSim,
                                   sim: OpenAICompatService) -> None:  # fmt: skip
    answer = await client.post("/v1/scrape", json={
        "url": site.url("/pages/6"), "formats": ["extract"],
        "extract": {"prompt": "the title", "schema": SCHEMA}})  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"]["extract"] == {"title": "Page 6"}
    answer = await client.post("/v1/scrape", json={
        "url": site.url("/pages/7"), "formats": ["json"],
        "jsonOptions": {"schema": {"type": "object"}}})  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"]["json"]["title"] == "Page 7"
    assert sim.requests[-1]["response_format"]["json_schema"]["strict"] is False  # no properties


async def test_cancel_drops_calls_in_flight(client: httpx.AsyncClient, site: SiteSim,
                                            sim: OpenAICompatService, daemon: Daemon) -> None:  # fmt: skip
    sim.slow(1000, seconds=30)
    urls = [site.url(f"/pages/{i}") for i in range(40, 46)]
    job = (await client.post("/v2/batch/scrape", json={"urls": urls,
                                                       "formats": ["summary"]})).json()["id"]  # fmt: skip
    with trio.fail_after(10):
        while sim.in_flight < 3:
            await trio.sleep(0.02)
    assert sim.in_flight == 3  # max_concurrency
    assert (await client.delete(f"/v2/batch/scrape/{job}")).json()["status"] == "cancelled"
    with trio.fail_after(10):
        assert await wait_finished(client, job, "batch") == "cancelled"
        while daemon.llm.status()["providers"]["default"]["in_flight"]:
            await trio.sleep(0.02)
