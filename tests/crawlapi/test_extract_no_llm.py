"""Without `[llm]`, POST /v2/extract is a Firecrawl-style 400 saying an LLM must be configured
(before any other check), and the routes are still in /openapi.json."""

from __future__ import annotations

import httpx


async def test_extract_without_llm_is_a_400_naming_the_llm(client: httpx.AsyncClient) -> None:
    answer = await client.post("/v2/extract", json={"urls": ["http://a.test/"], "prompt": "x"})
    assert answer.status_code == 400
    body = answer.json()
    assert body["success"] is False and body["code"] == "BAD_REQUEST"
    assert "needs an LLM" in body["details"][0]["message"]
    assert "[llm]" in body["details"][0]["message"]
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert "post" in paths["/v2/extract"] and "get" in paths["/v2/extract/{id}"]
    missing = await client.get("/v2/extract/0190d0a4-5d2e-7b3a-9c1d-2e3f4a5b6c7d")
    assert missing.status_code == 404
