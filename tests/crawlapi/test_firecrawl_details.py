"""Firecrawl's request and status details through the whole daemon over real HTTP: what
Firecrawl's own server accepts or refuses and the fields its clients read."""

from __future__ import annotations

import httpx
import pytest

from daemon.fakes.site import SiteSim


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
