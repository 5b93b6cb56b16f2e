"""/v2/extract with a web search provider ([search], the SearXNG simulator): a prompt without urls
reads the pages a search for it finds; `enableWebSearch` adds them to the urls; a search that
fails or finds nothing is a clear job failure (or, next to urls, an entry of the job's errors)."""

from __future__ import annotations

import functools
from typing import Any

import httpx
import pytest
import trio

from daemon.fakes.openai_compat import OpenAICompatService
from daemon.fakes.searxng import SearxngSim, serve_searxng
from daemon.fakes.site import SiteSim

from .conftest import CONFIG
from .test_extract import SHOP, wait_extract

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}}


@pytest.fixture
async def searxng(nursery: trio.Nursery, site: SiteSim) -> SearxngSim:
    site.files.update(SHOP)
    sim = SearxngSim(site_base=f"http://site.test:{site.port}")
    host, port = await nursery.start(functools.partial(serve_searxng, sim))
    sim.address = f"http://{host}:{port}"  # type: ignore[attr-defined]
    return sim


@pytest.fixture
def crawl_config(searxng: SearxngSim, llm: tuple[OpenAICompatService, str]) -> str:
    address = searxng.address  # type: ignore[attr-defined]
    return (
        CONFIG
        + f'[search]\nbase_url = "{address}"\nengines = ["fake"]\nretries = 0\n'
        + f'[llm]\nbase_url = "{llm[1]}"\nmodel = "sim"\ncache_ttl = "0s"\nretries = 0\n'
    )


def _results(searxng: SearxngSim, n: int = 10) -> list[str]:
    return [searxng.result_url(i) for i in range(n)]


async def test_a_prompt_without_urls_reads_what_a_search_finds(
    client: httpx.AsyncClient, searxng: SearxngSim, llm: tuple[OpenAICompatService, str]
) -> None:
    body = {"prompt": "Page name", "schema": SCHEMA, "showSources": True}
    job_id = (await client.post("/v2/extract", json=body)).json()["id"]
    done = await wait_extract(client, job_id)
    assert done["status"] == "completed", done
    [query] = [r["q"] for r in searxng.requests]
    assert query == "Page name"
    reachable = [u for u in _results(searxng) if "site.test" in u]  # the others: no such host
    assert done["sources"]["name"] == [reachable[0]]
    assert done["data"] == {"name": "Page 0"}
    assert len(llm[0].requests) == len(reachable)
    assert f"{10 - len(reachable)} of 10 pages could not be extracted" in done["warning"]


async def test_enable_web_search_adds_the_results_to_the_urls(
    client: httpx.AsyncClient, searxng: SearxngSim, site: SiteSim
) -> None:
    body = {"urls": [site.url("/solo")], "prompt": "Solo", "schema": SCHEMA,
            "enableWebSearch": True, "showSources": True}  # fmt: skip
    job_id = (await client.post("/v2/extract", json=body)).json()["id"]
    done = await wait_extract(client, job_id)
    assert done["status"] == "completed"
    assert done["data"] == {"name": "Solo Corp"}  # the request's URL comes first
    total = (await client.get(f"/v2/crawl/{job_id}?limit=1")).json()["total"]
    assert total == 11


async def test_a_search_that_finds_nothing_fails_the_job(
    client: httpx.AsyncClient, searxng: SearxngSim
) -> None:
    searxng.total = 0
    job_id = (await client.post("/v2/extract", json={"prompt": "nothing"})).json()["id"]
    done = await wait_extract(client, job_id)
    assert done["status"] == "failed" and done["error"] == "No search results found"


async def test_a_search_that_fails_is_the_jobs_error_or_next_to_urls_an_entry(
    client: httpx.AsyncClient, searxng: SearxngSim, site: SiteSim
) -> None:
    searxng.mode = "down"
    job_id = (await client.post("/v2/extract", json={"prompt": "x"})).json()["id"]
    done = await wait_extract(client, job_id)
    assert done["status"] == "failed" and done["error"].startswith("Web search failed:")
    body: dict[str, Any] = {"urls": [site.url("/solo")], "prompt": "x", "schema": SCHEMA,
                            "enableWebSearch": True}  # fmt: skip
    job_id = (await client.post("/v2/extract", json=body)).json()["id"]
    done = await wait_extract(client, job_id)
    assert done["status"] == "completed" and done["data"] == {"name": "Solo Corp"}
    errors = (await client.get(f"/v2/crawl/{job_id}/errors")).json()["errors"]
    assert [e["code"] for e in errors] == ["SEARCH_FAILED"]


async def test_a_web_search_needs_a_prompt(client: httpx.AsyncClient, site: SiteSim) -> None:
    body = {"urls": [site.url("/solo")], "schema": SCHEMA, "enableWebSearch": True}
    answer = await client.post("/v2/extract", json=body)
    assert answer.status_code == 400
    assert answer.json()["details"][0]["path"] == "$.prompt"
