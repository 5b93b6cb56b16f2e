"""Crawl prompts through firecrawl-py and raw HTTP, against the model simulator and the generated
site: params-preview answers the options a prompt gives (the site mapped first, the model's
answer checked by the crawl rules), a prompted crawl runs with them under the request's own keys,
bad input never reaches the model, and a missing or failing model is a clear error with no job."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from firecrawl import Firecrawl
from firecrawl.v2.utils.error_handler import FirecrawlError

from daemon.app import Daemon
from daemon.fakes.openai_compat import OpenAICompatService
from daemon.fakes.site import SiteSim
from tests.crawlapi.test_sdk_llm import crawl_config, llm_sim, sim  # noqa: F401

NULLS = dict.fromkeys(
    ("includePaths", "excludePaths", "maxDiscoveryDepth", "crawlEntireDomain",
     "allowExternalLinks", "allowSubdomains", "sitemap", "ignoreQueryParameters",
     "deduplicateSimilarURLs", "delay", "limit")
)  # fmt: skip


def answer(**options: Any) -> str:
    """What the model simulator is told to reply: every option, those not given null."""
    return json.dumps({**NULLS, **options})


def sent(sim: OpenAICompatService) -> tuple[str, str]:  # noqa: F811
    """(the instructions, the page content) of the last request to the model."""
    user = sim.requests[-1]["messages"][-1]["content"]
    instructions, _, content = user.partition("Page content:\n")
    return instructions, content


async def test_params_preview_through_the_sdk(
    fc: Firecrawl,
    sdk: Any,
    site: SiteSim,
    sim: OpenAICompatService,  # noqa: F811
) -> None:
    sim.reply(answer(includePaths=["^/pages/"], limit=5, sitemap="skip", delay=99))
    data = await sdk(fc.crawl_params_preview, site.url("/"), "only the tree pages, five of them")
    assert data.include_paths == ["^/pages/"] and data.limit == 5 and data.sitemap == "skip"
    assert data.delay is None  # 99 s is refused by the crawl rules: dropped, said
    assert "generated delay 99 dropped" in data.warning
    instructions, content = sent(sim)
    assert instructions.rstrip().endswith("only the tree pages, five of them")
    assert content.startswith(f"Start URL: {site.url('/')}\n")
    assert site.url("/pages/0") in content  # the site was mapped first
    schema = sim.requests[-1]["response_format"]["json_schema"]["schema"]
    assert "includePaths" in schema["properties"]


async def test_params_preview_answers_only_what_the_prompt_set(
    client: httpx.AsyncClient,
    site: SiteSim,
    sim: OpenAICompatService,  # noqa: F811
) -> None:
    sim.reply(answer(excludePaths=["^/slow"], crawlEntireDomain=True))
    response = await client.post("/v2/crawl/params-preview",
                                 json={"url": site.url("/"), "prompt": "skip the slow page"})  # fmt: skip
    assert response.status_code == 200
    assert response.json() == {"success": True, "data": {
        "url": site.url("/"), "excludePaths": ["^/slow"], "crawlEntireDomain": True}}  # fmt: skip


async def test_a_prompted_crawl_runs_with_the_generated_options(
    fc: Firecrawl, sdk: Any, client: httpx.AsyncClient, site: SiteSim,
    sim: OpenAICompatService,  # noqa: F811
) -> None:  # fmt: skip
    generated = answer(includePaths=["^/pages/\\d+$"], limit=4, allowSubdomains=True)
    sim.reply(generated)
    # firecrawl-py sends crawlEntireDomain (false by default) itself: a prompt cannot change it
    job = await sdk(fc.crawl, site.url("/pages/0"), prompt="four tree pages",
                    crawl_entire_domain=True, poll_interval=1)  # fmt: skip
    urls = [doc.metadata.source_url for doc in job.data]
    assert job.status == "completed" and len(urls) == 4
    assert all("/pages/" in url for url in urls)
    sim.reply(generated)
    started = await client.post("/v2/crawl", json={"url": site.url("/pages/0"),
                                                   "prompt": "four tree pages", "limit": 2,
                                                   "allowSubdomains": False})  # fmt: skip
    body = started.json()
    assert started.status_code == 200, body
    assert body["promptGeneratedOptions"] == {"includePaths": ["^/pages/\\d+$"], "limit": 4,
                                              "allowSubdomains": True}  # fmt: skip
    final = body["finalCrawlerOptions"]
    assert (final["limit"], final["allowSubdomains"]) == (2, False)  # the request's keys win
    assert final["includePaths"] == ["^/pages/\\d+$"] and "prompt" not in final
    assert "generated allowSubdomains, limit not used" in body["warning"]


async def test_bad_input_never_reaches_the_model(
    client: httpx.AsyncClient,
    site: SiteSim,
    sim: OpenAICompatService,  # noqa: F811
) -> None:
    cases = [
        ("/v2/crawl", {"url": site.url("/"), "prompt": "x" * 10_001}, "$.prompt"),
        ("/v2/crawl", {"url": site.url("/"), "prompt": "p", "includePaths": ["("]},
         "$.includePaths"),
        ("/v2/crawl", {"url": "ftp://x", "prompt": "p"}, "$.url"),
        ("/v2/crawl/params-preview", {"url": site.url("/")}, "$"),
        ("/v2/crawl/params-preview", {"url": site.url("/"), "prompt": "  "}, "$.prompt"),
        ("/v2/crawl/params-preview", {"url": site.url("/"), "prompt": "x" * 10_001}, "$.prompt"),
        ("/v2/crawl/params-preview", {"url": site.url("/"), "prompt": "p", "limit": 3}, "$.limit"),
        ("/v2/crawl/params-preview", {"url": "nope", "prompt": "p"}, "$.url"),
    ]  # fmt: skip
    for path, body, where in cases:
        response = await client.post(path, json=body)
        assert response.status_code == 400, (body, response.text)
        details = response.json()["details"]
        assert any(d["path"] == where for d in details), (where, details)
    assert sim.requests == []


async def test_a_model_that_fails_is_a_clear_error_and_no_job(
    client: httpx.AsyncClient, fc: Firecrawl, sdk: Any, site: SiteSim,
    sim: OpenAICompatService,  # noqa: F811
) -> None:  # fmt: skip
    sim.invalid_json(times=5)
    garbled = await client.post("/v2/crawl", json={"url": site.url("/"), "prompt": "blog"})
    assert garbled.status_code == 400
    assert garbled.json()["error"].startswith("Failed to process natural language prompt.")
    sim.reset()
    sim.fail(times=20, status=503)
    down = await client.post("/v2/crawl/params-preview", json={"url": site.url("/"),
                                                               "prompt": "blog"})  # fmt: skip
    assert down.status_code == 502 and down.json()["code"] == "LLM_UNAVAILABLE"
    sim.reset()
    sim.reply(answer(includePaths=["("], limit=0))  # valid JSON, refused by crawl rules
    nothing = await client.post("/v2/crawl/params-preview", json={"url": site.url("/"),
                                                                  "prompt": "odd"})  # fmt: skip
    assert nothing.status_code == 200 and nothing.json()["data"] == {"url": site.url("/")}
    assert "generated includePaths" in nothing.json()["warning"]
    assert "generated limit 0 dropped" in nothing.json()["warning"]
    assert (await client.get("/v2/crawl/active")).json()["crawls"] == []
    sim.reset()
    sim.fail(times=20, status=500)
    with pytest.raises(FirecrawlError):
        await sdk(fc.crawl, site.url("/"), prompt="blog", poll_interval=1)
    status = (await client.get("/status")).json()["crawl"]["prompts"]
    assert status["failed"] >= 3 and status["configured"] is True


async def test_without_llm_a_prompt_is_refused_naming_it(
    client: httpx.AsyncClient,
    daemon: Daemon,
    site: SiteSim,
    sim: OpenAICompatService,  # noqa: F811
) -> None:
    daemon.parts["llm"].configure(None)  # as a reload that removed [llm]
    for path in ("/v2/crawl", "/v2/crawl/params-preview"):
        response = await client.post(path, json={"url": site.url("/"), "prompt": "blog"})
        assert response.status_code == 501  # the feature is missing here, as /v2/extract's
        body = response.json()
        assert body["code"] == "LLM_NOT_CONFIGURED" and "[llm]" in body["error"]
    plain = await client.post("/v2/crawl", json={"url": site.url("/"), "limit": 1})
    assert plain.status_code == 200  # a crawl without a prompt needs no model
    assert sim.requests == []


async def test_the_routes_are_in_openapi(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    preview = paths["/v2/crawl/params-preview"]["post"]
    assert {"200", "400", "501", "502"} <= set(preview["responses"])
    assert preview["requestBody"]["required"] is True
    assert {"501", "502"} <= set(paths["/v2/crawl"]["post"]["responses"])
    schema = json.dumps(preview)
    assert "prompt" in schema or "ParamsPreviewRequest" in schema
