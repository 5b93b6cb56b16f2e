"""POST /v2/scrape through firecrawl-py: documents, options, Firecrawl's errors and codes."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from firecrawl import Firecrawl
from firecrawl.v2.utils.error_handler import (
    BadRequestError,
    DNSResolutionError,
    InternalServerError,
    RequestTimeoutError,
    WebsiteNotSupportedError,
)

from daemon.fakes.site import SiteSim


async def test_scrape_markdown_by_default(fc: Firecrawl, sdk: Any, site: SiteSim) -> None:
    doc = await sdk(fc.scrape, site.url("/pages/3"))
    assert doc.markdown.startswith("# Page 3")
    assert doc.html is None and doc.raw_html is None and doc.links is None
    meta = doc.metadata_dict
    assert meta["source_url"] == meta["url"] == site.url("/pages/3")
    assert (meta["status_code"], meta["proxy_used"]) == (200, "basic")
    assert meta["description"] == "Generated page 3"


async def test_scrape_formats_and_cleaning(fc: Firecrawl, sdk: Any, site: SiteSim) -> None:
    doc = await sdk(fc.scrape, site.url("/rich"),
                    formats=["markdown", "html", "rawHtml", "links"])  # fmt: skip
    assert "Footer text" not in doc.markdown and "Rich content" in doc.markdown
    assert "<Base64-Image-Removed>" in doc.markdown
    assert "<script" not in doc.html and "<script" in doc.raw_html
    assert site.url("/pages/3") in doc.links
    assert doc.metadata.og_title == "Rich OG title"
    whole = await sdk(fc.scrape, site.url("/rich"), only_main_content=False,
                      remove_base64_images=False, exclude_tags=["table"])  # fmt: skip
    assert "Footer text" in whole.markdown and "data:image/png;base64" in whole.markdown
    assert "alpha" not in whole.markdown


async def test_scrape_of_error_pages_and_files(fc: Firecrawl, sdk: Any, site: SiteSim) -> None:
    missing = await sdk(fc.scrape, site.url("/status/404"))
    assert missing.metadata.status_code == 404  # a document, not an error (as Firecrawl)
    data = await sdk(fc.scrape, site.url("/files/data.json"))
    assert data.markdown == '```json\n{"items": [1, 2, 3]}\n```'
    with pytest.raises(InternalServerError) as info:  # images are OCR'd only with "image"
        await sdk(fc.scrape, site.url("/files/image.png"), parsers=["pdf"])
    assert info.value.code == "SCRAPE_UNSUPPORTED_FILE_ERROR"


async def test_scrape_failures_map_to_sdk_errors(
    fc: Firecrawl, sdk: Any, site: SiteSim, client: httpx.AsyncClient
) -> None:
    with pytest.raises(DNSResolutionError):
        await sdk(fc.scrape, "http://nowhere.test/")
    # Firecrawl's v2 scrape answers a host that does not resolve with 200 and success: false
    unresolved = await client.post("/v2/scrape", json={"url": "http://nowhere.test/"})
    assert unresolved.status_code == 200, unresolved.text
    assert unresolved.json()["success"] is False
    assert unresolved.json()["code"] == "SCRAPE_DNS_RESOLUTION_ERROR"
    with pytest.raises(WebsiteNotSupportedError, match="refused"):
        await sdk(fc.scrape, site.url("/redirect/metadata"))  # the SSRF guard at a redirect hop
    answer = await client.post("/v2/scrape", json={"url": "http://169.254.169.254/latest/"})
    assert answer.status_code == 403 and answer.json()["success"] is False
    site.slow_seconds = 30
    with pytest.raises(RequestTimeoutError):
        await sdk(fc.scrape, site.url("/slow"), timeout=1000)


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        ({"formats": ["screenshot"]}, "$.formats[0]", "needs a browser"),
        ({"formats": [{"type": "json", "prompt": "x"}]}, "$.formats[0]", "needs an LLM"),
        ({"formats": ["summary"]}, "$.formats[0]", "needs an LLM"),
        (
            {"formats": [{"type": "question", "question": "q"}]},
            "$.formats[0]",
            "format 'question' needs an LLM: no [llm] is configured",
        ),
        ({"formats": [{"type": "highlights", "query": "q"}]}, "$.formats[0]", "needs an LLM"),
        ({"formats": [{"type": "query", "prompt": "q"}]}, "$.formats[0]", "needs an LLM"),
        ({"formats": ["attributes"]}, "$.formats[0].selectors", "pass a dict"),
        ({"formats": ["branding"]}, "$.formats[0]", "format 'branding' is not supported by crawld"),
        ({"formats": ["product"]}, "$.formats[0]", "is not supported by crawld"),
        ({"redactPII": True}, "$.redactPII", "redactPII is not supported by crawld"),
        ({"checkPromptInjection": True}, "$.checkPromptInjection", "is not supported by crawld"),
        ({"formats": ["changeTracking"]}, "$.formats[0]", "requires the markdown format"),
        ({"formats": ["bogus"]}, "$.formats[0]", "unknown format"),
        ({"actions": [{"type": "wait", "milliseconds": 5}]}, "$.actions", "browser"),
        ({"colour": "blue"}, "$.colour", "unrecognized key"),
        ({"timeout": 5}, "$.timeout", ">= 1000"),
    ],
)
async def test_unsupported_options_are_refused_with_their_path(
    client: httpx.AsyncClient, site: SiteSim, body: dict[str, Any], path: str, message: str
) -> None:
    answer = await client.post("/v2/scrape", json={"url": site.url("/"), **body})
    assert answer.status_code == 400
    got = answer.json()
    assert (got["success"], got["code"], got["error"]) == (False, "BAD_REQUEST", "Bad Request")
    assert any(d["path"] == path and message in d["message"] for d in got["details"])
    assert got["detail"] == got["details"]


async def test_sdk_refuses_screenshot_with_bad_request(
    fc: Firecrawl, sdk: Any, site: SiteSim
) -> None:
    with pytest.raises(BadRequestError):
        await sdk(fc.scrape, site.url("/"), formats=["screenshot"])


async def test_ignored_cloud_options_are_accepted_with_a_warning(
    client: httpx.AsyncClient, site: SiteSim
) -> None:
    body = {"url": site.url("/about"), "origin": "python-sdk@4.55.0", "onlyMainContent": True,
            "removeBase64Images": True, "fastMode": False, "blockAds": True, "storeInCache": True,
            "maxAge": 14400000, "mobile": True, "proxy": "stealth", "waitFor": 100,
            "zeroDataRetention": False, "skipTlsVerification": True}  # fmt: skip
    answer = (await client.post("/v2/scrape", json=body)).json()
    assert answer["success"] is True and "About" in answer["data"]["markdown"]
    assert "waitFor is ignored" in answer["warning"] and "mobile" in answer["warning"]
