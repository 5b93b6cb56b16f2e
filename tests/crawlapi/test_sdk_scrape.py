"""POST /v2/scrape through firecrawl-py: documents, options, Firecrawl's errors."""

from __future__ import annotations

from typing import Any

from firecrawl import Firecrawl

from daemon.fakes.site import SiteSim


async def test_scrape_markdown_by_default(fc: Firecrawl, sdk: Any, site: SiteSim) -> None:
    doc = await sdk(fc.scrape, site.url("/pages/3"))
    assert "Page 3" in doc.markdown
    assert doc.html is None and doc.raw_html is None
    meta = doc.metadata_dict
    assert meta["source_url"] == site.url("/pages/3") or meta.get("sourceURL")
    assert doc.metadata.status_code == 200
