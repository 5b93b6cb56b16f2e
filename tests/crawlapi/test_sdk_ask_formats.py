"""The question, highlights, query and attributes formats end to end: firecrawl-py 4.55 and raw
HTTP against a crawld with the OpenAI-compatible simulator as its `[llm]` (and SearXNG's for
search): answers land in the documents of scrapes, crawls, batches and search results, highlights
are only text of the page, another question is never served from the cache, attributes need no
model, and bad input is a 400 naming the field that never reaches the model."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from firecrawl import Firecrawl
from firecrawl.v2.types import AttributeSelector, AttributesFormat, QueryFormat, ScrapeOptions
from firecrawl.v2.utils.error_handler import BadRequestError

from daemon.app import Daemon
from daemon.crawl.llmwork.rules import collapse
from daemon.fakes.openai_compat import OpenAICompatService
from daemon.fakes.searxng import SearxngSim
from daemon.fakes.site import SiteSim
from tests.crawlapi.test_sdk_llm import llm_sim  # noqa: F401 (fixture)
from tests.crawlapi.test_search import searxng  # noqa: F401 (fixture)

from .conftest import CONFIG, wait_finished

QUESTION = {"type": "question", "question": "Which page is this?"}
HIGHLIGHTS = {"type": "highlights", "query": "links to other pages"}
PLANS = (
    b"<html><head><title>Plans</title></head><body><main><h1>Plans</h1>"
    b"<p>The basic plan costs <b>12 EUR</b> a month.</p>"
    b"<p>The pro plan costs 30 EUR a month,\n billed yearly.</p>"
    b"<ul><li>Free trial: 14 days</li><li>Cancel any time</li></ul></main></body></html>",
    "text/html",
)


@pytest.fixture
def crawl_config(llm_sim: tuple[OpenAICompatService, str], searxng: SearxngSim) -> str:  # noqa: F811
    address = searxng.address  # type: ignore[attr-defined]
    return CONFIG + (
        f'[search]\nbase_url = "{address}"\nengines = ["fake"]\n'
        f'[llm]\nbase_url = "{llm_sim[1]}"\nmodel = "sim-model"\ntimeout = "2s"\n'
        'max_concurrency = 3\nretries = 1\nretry_backoff_max = "50ms"\n'
    )


@pytest.fixture
def sim(llm_sim: tuple[OpenAICompatService, str]) -> OpenAICompatService:  # noqa: F811
    return llm_sim[0]


def prompts(sim: OpenAICompatService) -> list[str]:
    return [r["messages"][-1]["content"].split("Page content:\n", 1)[0] for r in sim.requests]


def assert_verbatim(highlights: str, markdown: str) -> list[str]:
    passages = highlights.split("\n\n")
    assert passages and all(p and p in collapse(markdown) for p in passages), passages
    return passages


async def test_scrape_question_highlights_and_query(fc: Firecrawl, sdk: Any, site: SiteSim,
                                                    sim: OpenAICompatService) -> None:  # fmt: skip
    doc = await sdk(fc.scrape, site.url("/pages/3"), formats=["markdown", QUESTION, HIGHLIGHTS])
    assert doc.answer == "Page 3"  # the simulator answers with the page's first line
    passages = assert_verbatim(doc.highlights, doc.markdown)
    assert any("Page 7" in p for p in passages)  # the page's list items
    assert len(sim.requests) == 2
    assert sorted(p.strip().rsplit("\n", 1)[-1] for p in prompts(sim)) == [
        "Query: links to other pages", "Question: Which page is this?"]  # fmt: skip
    free = await sdk(fc.scrape, site.url("/pages/4"), formats=[QueryFormat(prompt="which page?")])
    quote = await sdk(fc.scrape, site.url("/pages/4"),
                      formats=["markdown", QueryFormat(prompt="links", mode="directQuote")])  # fmt: skip
    assert free.answer == "Page 4" and free.markdown is None and free.highlights is None
    assert_verbatim(quote.answer, quote.markdown)
    usage = await sdk(fc.get_token_usage)  # counted as json and summary are
    assert usage.remaining_tokens == 99_999_999


async def test_highlights_the_page_does_not_hold_are_dropped(
    client: httpx.AsyncClient, site: SiteSim, sim: OpenAICompatService
) -> None:
    site.files["/plans"] = PLANS
    proposed = ["The pro plan costs 30 EUR a month, billed yearly.",  # a line break collapsed
                "The basic plan costs 12 EUR a month.",  # the page has **12 EUR**
                "The enterprise plan costs 99 EUR.", "Free trial: 14 days"]  # fmt: skip
    sim.reply(json.dumps({"passages": proposed}))
    answer = await client.post("/v2/scrape", json={"url": site.url("/plans"),
                                                   "formats": [HIGHLIGHTS]})  # fmt: skip
    data = answer.json()["data"]
    assert data["highlights"] == (
        "The pro plan costs 30 EUR a month, billed yearly.\n\nFree trial: 14 days"
    )
    assert data["warning"] == ("Highlights: 2 of the 4 passages the model proposed are not "
                               "verbatim text of the page and were dropped.")  # fmt: skip
    assert "markdown" not in data


async def test_the_cache_never_answers_another_question(
    client: httpx.AsyncClient, site: SiteSim, sim: OpenAICompatService
) -> None:
    site.files["/plans"] = PLANS

    async def ask(question: str) -> dict[str, Any]:
        body = {"url": site.url("/plans"), "formats": [{"type": "question", "question": question}]}
        answer = await client.post("/v2/scrape", json=body)
        assert answer.status_code == 200, answer.text
        return dict(answer.json()["data"])

    sim.reply(json.dumps({"answer": "12 EUR"}))
    first = await ask("What does the basic plan cost?")
    again = await ask("What does the basic plan cost?")
    assert first["answer"] == again["answer"] == "12 EUR"
    assert (first["metadata"]["cacheState"], again["metadata"]["cacheState"]) == ("miss", "hit")
    sim.reply(json.dumps({"answer": "30 EUR"}))
    other = await ask("What does the pro plan cost?")
    assert other["answer"] == "30 EUR" and other["metadata"]["cacheState"] == "miss"
    assert len(sim.requests) == 2


async def test_crawl_batch_and_search_pages_get_their_own_answers(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim, sim: OpenAICompatService
) -> None:
    crawl = await sdk(fc.crawl, site.url("/pages/0"), limit=5, include_paths=["^/pages/\\d+$"],
                      crawl_entire_domain=True, poll_interval=1,
                      scrape_options=ScrapeOptions(formats=["markdown", QUESTION, HIGHLIGHTS]))  # fmt: skip
    assert crawl.status == "completed" and len(crawl.data) == 5
    for doc in crawl.data:
        assert doc.answer == doc.markdown.splitlines()[0].lstrip("# ")
        assert_verbatim(doc.highlights, doc.markdown)
    urls = [site.url(f"/pages/{i}") for i in (20, 21, 22)]
    batch = await sdk(fc.batch_scrape, urls, formats=[QUESTION], poll_interval=1)
    assert sorted(d.answer for d in batch.data) == ["Page 20", "Page 21", "Page 22"]
    found = await sdk(fc.search, "q", limit=3, include_domains=["site.test"],
                      scrape_options=ScrapeOptions(formats=["markdown", QUESTION]))  # fmt: skip
    assert len(found.web) == 3  # (firecrawl-py reads a result as a Document when it has markdown)
    for doc in found.web:
        assert doc.answer == f"Page {doc.metadata.url.rsplit('/', 1)[1]}"
    assert len(sim.requests) <= 5 * 2 + 3 + 3  # the same question of the same page: cached


async def test_attributes_need_no_model(client: httpx.AsyncClient, site: SiteSim,
                                        sim: OpenAICompatService, daemon: Daemon) -> None:  # fmt: skip
    fmt = {"type": "attributes", "selectors": [
        {"selector": "main ul a", "attribute": "href"},
        {"selector": "meta[name=description]", "attribute": "content"},
        {"selector": "nav a", "attribute": "href"},  # not main content, but in the DOM
        {"selector": "table.none", "attribute": "id"}]}  # fmt: skip
    site.files["/notes.txt"] = (b"plain text, no DOM", "text/plain")
    path = trio.Path(daemon.config.source)
    await path.write_text(CONFIG)  # no [llm]: attributes still work, question does not
    assert await daemon.reload()
    answer = await client.post("/v2/scrape", json={"url": site.url("/pages/3"), "formats": [fmt]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"]["attributes"] == [
        {"selector": "main ul a", "attribute": "href", "values": ["/pages/7", "/pages/8"]},
        {"selector": "meta[name=description]", "attribute": "content",
         "values": ["Generated page 3"]},
        {"selector": "nav a", "attribute": "href", "values": ["/", "/about"]},
        {"selector": "table.none", "attribute": "id", "values": []}]  # fmt: skip
    start = await client.post("/v2/batch/scrape", json={
        "urls": [site.url("/pages/5"), site.url("/notes.txt")], "formats": [fmt]})  # fmt: skip
    job = start.json()["id"]
    assert await wait_finished(client, job, "batch") == "completed"
    data = (await client.get(f"/v2/batch/scrape/{job}")).json()["data"]
    by_url = {d["metadata"]["sourceURL"].rsplit("/", 1)[1]: d["attributes"] for d in data}
    assert by_url["5"][0]["values"] == ["/pages/11", "/pages/12"]
    assert [e["values"] for e in by_url["notes.txt"]] == [[], [], [], []]
    refused = await client.post("/v2/scrape", json={"url": site.url("/"), "formats": [QUESTION]})
    assert refused.status_code == 400
    assert refused.json()["details"][0]["message"] == (
        "format 'question' needs an LLM: no [llm] is configured (add an [llm] section, "
        "docs/how-to/llm-formats.md)"
    )
    assert sim.requests == []


async def test_sdk_attributes_object_is_a_clear_400(fc: Firecrawl, sdk: Any, site: SiteSim) -> None:
    fmt = AttributesFormat(selectors=[AttributeSelector(selector="a", attribute="href")])
    with pytest.raises(BadRequestError) as caught:
        await sdk(fc.scrape, site.url("/"), formats=[fmt])  # firecrawl-py sends "attributes"
    assert "selectors" in str(caught.value) and "pass a dict" in str(caught.value)
    with pytest.raises(BadRequestError):
        await sdk(fc.scrape, site.url("/"), formats=[fmt.model_dump(), fmt])


@pytest.mark.parametrize(
    ("fmt", "path", "message"),
    [
        ({"type": "question", "question": "x" * 10_001}, "$.formats[0].question", "at most 10000"),
        ({"type": "question", "question": " "}, "$.formats[0].question", "a non-empty string"),
        ("highlights", "$.formats[0].query", '{"type": "highlights", "query": "..."}'),
        ({"type": "query", "prompt": "x", "mode": "quote"}, "$.formats[0].mode", "'freeform'"),
        ({"type": "question", "question": "q", "schema": {}}, "$.formats[0].schema",
         "unrecognized key"),
        ({"type": "attributes", "selectors": [{"selector": "a[", "attribute": "href"}]},
         "$.formats[0].selectors[0].selector", "not a CSS selector"),
        ({"type": "attributes"}, "$.formats[0].selectors", "needs `selectors`"),
    ],
)  # fmt: skip
async def test_bad_input_is_a_400_that_never_reaches_the_model(
    client: httpx.AsyncClient, site: SiteSim, sim: OpenAICompatService,
    fmt: Any, path: str, message: str,
) -> None:  # fmt: skip
    for route, body in (("/v2/scrape", {"url": site.url("/pages/1"), "formats": [fmt]}),
                        ("/v2/batch/scrape", {"urls": [site.url("/pages/1")], "formats": [fmt]}),
                        ("/v2/crawl", {"url": site.url("/"), "scrapeOptions": {"formats": [fmt]}}),
                        ("/v2/search", {"query": "q", "scrapeOptions": {"formats": [fmt]}})):  # fmt: skip
        answer = await client.post(route, json=body)
        assert answer.status_code == 400, (route, answer.text)
        where = path if route in ("/v2/scrape", "/v2/batch/scrape") else path.replace(
            "$.", "$.scrapeOptions.")  # fmt: skip
        details = answer.json()["details"]
        assert any(d["path"] == where and message in d["message"] for d in details), details
    assert sim.requests == []


async def test_one_answer_per_request_and_true_refusals(client: httpx.AsyncClient,
                                                        site: SiteSim) -> None:  # fmt: skip
    url = site.url("/pages/1")
    both = await client.post("/v2/scrape", json={"url": url, "formats": [
        QUESTION, {"type": "query", "prompt": "p"}, HIGHLIGHTS, HIGHLIGHTS]})  # fmt: skip
    assert [d["path"] for d in both.json()["details"]] == ["$.formats[1]", "$.formats[3]"]
    for body, path, text in (
        ({"formats": ["branding"]}, "$.formats[0]", "format 'branding' is not supported by crawld"),
        ({"formats": ["audio"]}, "$.formats[0]", "format 'audio' is not supported by crawld"),
        ({"checkPromptInjection": True}, "$.checkPromptInjection",
         "checkPromptInjection is not supported by crawld"),
    ):  # fmt: skip
        answer = await client.post("/v2/scrape", json={"url": url, **body})
        assert answer.json()["details"] == [{"path": path, "message": text}]


async def test_a_failing_model_leaves_a_warning(client: httpx.AsyncClient, site: SiteSim,
                                                sim: OpenAICompatService) -> None:  # fmt: skip
    sim.fail(100, status=400)
    answer = await client.post("/v2/scrape", json={"url": site.url("/pages/2"),
                                                   "formats": ["markdown", QUESTION, HIGHLIGHTS]})  # fmt: skip
    assert answer.status_code == 200
    data = answer.json()["data"]
    assert "answer" not in data and "highlights" not in data and data["markdown"]
    assert data["warning"].startswith("Question failed: LLM_BAD_REQUEST")
    assert "Highlights failed: LLM_BAD_REQUEST" in data["warning"]


async def test_a_batch_through_model_faults_loses_no_page(
    client: httpx.AsyncClient, site: SiteSim, sim: OpenAICompatService
) -> None:
    sim.fail(4, status=503)  # the first attempts fail; retries (1 each) may or may not recover
    urls = [site.url(f"/pages/{i}") for i in range(60, 66)]
    start = await client.post("/v2/batch/scrape", json={"urls": urls, "formats": [QUESTION]})
    job = start.json()["id"]
    with trio.fail_after(20):
        assert await wait_finished(client, job, "batch") == "completed"
    data = (await client.get(f"/v2/batch/scrape/{job}")).json()["data"]
    assert sorted(d["metadata"]["sourceURL"] for d in data) == sorted(urls)
    assert len({d["metadata"]["scrapeId"] for d in data}) == len(urls)
    for doc in data:  # every page either answered or says why not, never both, never neither
        page = doc["metadata"]["sourceURL"].rsplit("/", 1)[1]
        failed = doc.get("warning", "").startswith("Question failed: LLM_UNAVAILABLE")
        assert failed != ("answer" in doc), doc
        assert failed or doc["answer"] == f"Page {page}"
    # a page's second attempt follows only a failed first: 6 pages + the first attempts that
    # failed, and each failed page took two of the 4 failures
    answered = sum("answer" in d for d in data)
    assert len(sim.requests) == answered + 4
