"""changeTracking's json mode against the OpenAI-compatible simulator: with a schema, both
versions are extracted and only the keys that differ come back; without one, the model reads
both versions in one call; a failing endpoint leaves Firecrawl's warning and the rest of the
result."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from daemon.crawl.tracking import changes as tracking
from daemon.fakes.openai_compat import OpenAICompatService
from daemon.fakes.site import SiteSim
from tests.crawlapi.test_sdk_llm import crawl_config, llm_sim  # noqa: F401 (fixtures)

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}


@pytest.fixture
def sim(llm_sim: tuple[OpenAICompatService, str]) -> OpenAICompatService:  # noqa: F811
    return llm_sim[0]


def page(heading: str) -> tuple[bytes, str]:
    body = f"<html><body><main><h1>{heading}</h1><p>Some text here.</p></main></body></html>"
    return body.encode(), "text/html"


async def test_json_mode_with_and_without_a_schema(
    client: httpx.AsyncClient, site: SiteSim, sim: OpenAICompatService
) -> None:
    site.files["/watched"] = page("Before")
    url = site.url("/watched")

    async def scrape(fmt: dict[str, Any]) -> dict[str, Any]:
        body = {"url": url, "formats": ["markdown", {"type": "changeTracking", **fmt}]}
        answer = await client.post("/v2/scrape", json=body)
        assert answer.status_code == 200, answer.text
        return dict(answer.json()["data"])

    with_schema = {"modes": ["json", "git-diff"], "schema": SCHEMA, "tag": "s"}
    free = {"modes": ["json"], "prompt": "what changed?", "tag": "f"}
    assert (await scrape(with_schema))["changeTracking"]["changeStatus"] == "new"
    assert "json" not in (await scrape(free))["changeTracking"]
    assert sim.requests == []  # json only runs when the page changed
    site.files["/watched"] = page("After")
    changed = (await scrape(with_schema))["changeTracking"]
    assert changed["changeStatus"] == "changed"
    (key,) = changed["json"]
    assert key == "title" and "Before" in changed["json"]["title"]["previous"]
    assert "After" in changed["json"]["title"]["current"]
    assert "diff" in changed and len(sim.requests) == 2  # one extraction per version
    answered = (await scrape(free))["changeTracking"]
    assert answered["changeStatus"] == "changed" and isinstance(answered["json"], dict)
    sent = sim.requests[-1]["messages"][-1]["content"]
    assert "Previous Content:" in sent and "Current Content:" in sent
    sim.fail(times=100, status=400)
    site.files["/watched"] = page("Again")
    failed = await scrape(free)
    assert failed["changeTracking"]["changeStatus"] == "changed"
    assert "json" not in failed["changeTracking"]
    assert tracking.LLM_WARNING in failed["warning"]
