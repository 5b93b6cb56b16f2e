"""Run by tests/crawlapi/test_extract.py with firecrawl-py 1.17.0 on PYTHONPATH (not importable
next to 4.55): its `extract` (POST /v1/extract, then polls /v1/extract/{id}) against crawld."""

from __future__ import annotations

import json
import os
import sys

from firecrawl import FirecrawlApp  # type: ignore[attr-defined]


def main() -> None:
    site = os.environ["SITE_URL"]
    app = FirecrawlApp(api_key="any", api_url=os.environ["CRAWLD_URL"])
    schema = {"type": "object", "properties": {"name": {"type": "string"},
              "products": {"type": "array", "items": {"type": "string"}}}}  # fmt: skip
    result = app.extract([f"{site}/solo"], {"prompt": "The company", "schema": schema})
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
