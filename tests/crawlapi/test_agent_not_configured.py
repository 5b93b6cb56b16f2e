"""What /v2/agent needs and says it lacks: without `[llm]` a POST is a 501 naming `[llm]`
(before any other check: the feature is missing here, as /v2/extract's), without `[search]` an agent without urls is refused naming `[search]`,
while one given urls runs without searching; the routes are in /openapi.json either way."""

from __future__ import annotations

import httpx
import pytest

from daemon.fakes.openai_compat import OpenAICompatService
from daemon.fakes.site import SiteSim

from .conftest import CONFIG
from .test_agent import PAGES, wait_agent


async def test_without_llm_a_post_names_the_llm(client: httpx.AsyncClient) -> None:
    answer = await client.post("/v2/agent", json={"prompt": "x" * 10_001, "bogus": 1})
    assert answer.status_code == 501
    body = answer.json()
    assert body["success"] is False and body["code"] == "LLM_NOT_CONFIGURED"
    assert "needs an LLM" in body["error"] and "[llm]" in body["error"]
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert "post" in paths["/v2/agent"] and "get" in paths["/v2/agent/{id}/steps"]
    missing = await client.get("/v2/agent/0190d0a4-5d2e-7b3a-9c1d-2e3f4a5b6c7d")
    assert missing.status_code == 404


class TestWithoutSearch:
    @pytest.fixture
    def crawl_config(self, llm: tuple[OpenAICompatService, str]) -> str:
        return CONFIG + f'[llm]\nbase_url = "{llm[1]}"\nmodel = "sim"\ncache_ttl = "0s"\n'

    async def test_no_urls_names_search_and_urls_run_without_it(
        self, client: httpx.AsyncClient, site: SiteSim, llm: tuple[OpenAICompatService, str]
    ) -> None:
        answer = await client.post("/v2/agent", json={"prompt": "Company name"})
        assert answer.status_code == 400
        [problem] = answer.json()["details"]
        assert problem["path"] == "$.urls" and "[search]" in problem["message"]
        assert not llm[0].requests
        site.files.update(PAGES)
        body = {"prompt": "Company name", "urls": [site.url("/co/1")]}
        job_id = (await client.post("/v2/agent", json=body)).json()["id"]
        done = await wait_agent(client, job_id)
        assert done["status"] == "completed", done
        steps = (await client.get(f"/v2/agent/{job_id}/steps")).json()["steps"]
        assert [s["action"] for s in steps] == ["scrape", "answer"]
