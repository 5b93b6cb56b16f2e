"""Without `[llm]`, POST /v2/extract (and /v1/extract) is a Firecrawl-style 501 saying an LLM
must be configured (before any other check): the deployment lacks the feature, the request is
not bad. firecrawl-py raises its error with that message; the routes are still in
/openapi.json, which names the 501."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from firecrawl import Firecrawl
from firecrawl.v2.utils.error_handler import FirecrawlError


@pytest.mark.parametrize("path", ["/v2/extract", "/v1/extract"])
async def test_extract_without_llm_is_a_501_naming_the_llm(
    client: httpx.AsyncClient, path: str
) -> None:
    answer = await client.post(path, json={"urls": ["http://a.test/"], "prompt": "x"})
    assert answer.status_code == 501
    body = answer.json()
    assert body["success"] is False and body["code"] == "LLM_NOT_CONFIGURED"
    assert "needs an LLM" in body["error"] and "[llm]" in body["error"]
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert "501" in paths[path]["post"]["responses"]
    assert "get" in paths["/v2/extract/{id}"]
    missing = await client.get("/v2/extract/0190d0a4-5d2e-7b3a-9c1d-2e3f4a5b6c7d")
    assert missing.status_code == 404


async def test_the_sdk_raises_the_message(fc: Firecrawl, sdk: Any) -> None:
    with pytest.raises(FirecrawlError) as raised:
        await sdk(fc.start_extract, ["http://a.test/"], prompt="x")
    assert raised.value.status_code == 501 and "[llm]" in str(raised.value)
