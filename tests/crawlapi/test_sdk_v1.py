"""The v1 routes through raw HTTP and through firecrawl-py 1.17.0 (the last 1.x, run in a child
process with its own folder on PYTHONPATH: scripts/test installs it into .venv/sdk-v1)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon.fakes.site import SiteSim

SDK_V1 = Path(sys.prefix) / "sdk-v1"


def sdk_v1_or_fail() -> Path:
    if not (SDK_V1 / "firecrawl").is_dir():
        problem = f"firecrawl-py 1.x is not installed in {SDK_V1.name} (scripts/test installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    return SDK_V1


async def test_firecrawl_py_1x_works_unchanged(base_url: str, site: SiteSim) -> None:
    folder = sdk_v1_or_fail()
    env = {**os.environ, "PYTHONPATH": str(folder), "CRAWLD_URL": base_url,
           "SITE_URL": site.url("").rstrip("/")}  # fmt: skip
    script = Path(__file__).with_name("sdk_v1_client.py")
    with trio.fail_after(120):
        done = await trio.run_process([sys.executable, str(script)], env=env,
                                      capture_stdout=True, capture_stderr=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    out: dict[str, Any] = json.loads(done.stdout)
    assert out["version"].startswith("1.")
    assert out["scrape"]["markdown"].startswith("# Page 3") and out["scrape"]["links"] > 0
    assert out["crawl"]["status"] == "completed" and out["crawl"]["total"] == 6
    depths = [len([s for s in u.split("/", 3)[3].split("/") if s]) for u in out["crawl"]["urls"]]
    assert max(depths) <= 2  # maxDepth 2: /pages/N, never deeper
    assert out["async_crawl"]["url"].endswith(f"/v1/crawl/{out['async_crawl']['id']}")
    assert out["errors"] == {"errors": [], "robotsBlocked": []}
    assert out["batch"] == {"status": "completed", "html": [True, True]}
    assert len(out["map"]) == 5 and all(isinstance(u, str) for u in out["map"])
    assert "corresponding options must be provided" in out["bad_request"]


async def test_v1_routes_over_http(client: httpx.AsyncClient, site: SiteSim) -> None:
    scraped = await client.post("/v1/scrape", json={"url": site.url("/pages/2"),
                                                    "formats": ["rawHtml"], "parsePDF": True})  # fmt: skip
    assert scraped.status_code == 200 and "<html" in scraped.json()["data"]["rawHtml"]
    started = await client.post("/v1/batch/scrape", json={"urls": [site.url("/pages/4")]})
    job = started.json()["id"]
    assert started.json()["url"].endswith(f"/v1/batch/scrape/{job}")
    with trio.fail_after(30):
        while (status := (await client.get(f"/v1/crawl/{job}")).json())["status"] == "scraping":
            await trio.sleep(0.05)
    assert status["status"] == "completed" and status["data"][0]["markdown"].startswith("# Page 4")
    same = (await client.get(f"/v1/batch/scrape/{job}")).json()
    assert same["data"] == status["data"]
    assert (await client.get(f"/v1/batch/scrape/{job}/errors")).json()["errors"] == []
    active = await client.get("/v1/crawl/active")
    assert active.status_code == 200 and active.json()["success"] is True
    mapped = await client.post("/v1/map", json={"url": site.url("/"), "sitemapOnly": True,
                                                "limit": 3})  # fmt: skip
    assert mapped.json() == {"success": True, "links": mapped.json()["links"]}
    assert len(mapped.json()["links"]) == 3
    crawl = await client.post("/v1/crawl", json={"url": site.url("/pages/0"), "limit": 50})
    cancelled = await client.delete(f"/v1/crawl/{crawl.json()['id']}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/scrape", {"url": "https://a.test/", "formats": ["branding"]}, "$.formats[0]"),
        ("/v1/scrape", {"url": "https://a.test/", "sitemap": "skip"}, "$.sitemap"),
        ("/v1/crawl", {"url": "https://a.test/a/b", "maxDepth": 1}, "$.url"),
        (
            "/v1/crawl",
            {"url": "https://a.test/", "scrapeOptions": {"parsers": []}},
            "$.scrapeOptions.parsers",
        ),
        ("/v1/map", {"url": "https://a.test/", "limit": 40000}, "$.limit"),
        ("/v1/batch/scrape", {"urls": [], "extract": {}}, "$.formats"),
        ("/v1/search", {"query": "q", "sources": ["web"]}, "$.sources"),
    ],
)
async def test_v1_bad_requests_name_v1_fields(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], field: str
) -> None:
    response = await client.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["success"] is False
    assert field in {d["path"] for d in response.json()["details"]}


async def test_v1_search_without_provider_is_a_clear_501(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/search", json={"query": "q"})
    assert response.status_code == 501 and response.json()["code"] == "SEARCH_NOT_CONFIGURED"
