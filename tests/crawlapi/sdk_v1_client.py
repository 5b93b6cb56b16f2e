"""Run by tests/crawlapi/test_sdk_v1.py with firecrawl-py 1.17.0 on PYTHONPATH (not importable
next to 4.55): makes the SDK's v1 calls against crawld and prints what came back as JSON."""

from __future__ import annotations

import json
import os
import sys

from firecrawl import FirecrawlApp  # type: ignore[attr-defined]


def main() -> None:
    import firecrawl

    site = os.environ["SITE_URL"]
    app = FirecrawlApp(api_key="any", api_url=os.environ["CRAWLD_URL"])
    out: dict[str, object] = {"version": firecrawl.__version__}
    doc = app.scrape_url(f"{site}/pages/3", {"formats": ["markdown", "links"]})
    out["scrape"] = {"markdown": doc["markdown"][:40], "links": len(doc["links"]),
                     "sourceURL": doc["metadata"]["sourceURL"]}  # fmt: skip
    crawl = app.crawl_url(f"{site}/", {"limit": 6, "maxDepth": 2, "ignoreSitemap": True},
                          poll_interval=1)  # fmt: skip
    out["crawl"] = {"status": crawl["status"], "total": crawl["total"],
                    "urls": sorted(d["metadata"]["sourceURL"] for d in crawl["data"])}  # fmt: skip
    started = app.async_crawl_url(f"{site}/", {"limit": 3})
    out["async_crawl"] = {"id": started["id"], "url": started["url"]}
    out["errors"] = app.check_crawl_errors(started["id"])
    batch = app.batch_scrape_urls([f"{site}/pages/1", f"{site}/pages/2"], {"formats": ["html"]},
                                  poll_interval=1)  # fmt: skip
    out["batch"] = {"status": batch["status"], "html": [bool(d.get("html")) for d in batch["data"]]}
    mapped = app.map_url(f"{site}/", {"limit": 5})
    out["map"] = mapped["links"]
    try:
        app.scrape_url(f"{site}/pages/1", {"formats": ["json"]})
    except Exception as exc:  # the SDK raises HTTPError with Firecrawl's message
        out["bad_request"] = str(exc)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
