"""Schemathesis hooks of scripts/api_fuzz.py (loaded through SCHEMATHESIS_HOOKS): the rules of
crawld's request bodies that JSON Schema cannot state, told to the generator so that a case it
calls valid is valid. The checks are untouched; /openapi.json states each rule in the field's
description.

- `waitFor` at most half of `timeout` when both are set (Firecrawl's rule), in scrape options at
  the top of a body or under `scrapeOptions`;
- a v1 crawl's `url` has at most `maxDepth` path segments (Firecrawl's v1 rule).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import schemathesis


def _waits_too_long(options: Any) -> bool:
    if not isinstance(options, dict):
        return False
    wait, timeout = options.get("waitFor"), options.get("timeout")
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (wait, timeout))
    return numbers and wait > 0 and timeout > 0 and wait > timeout / 2


def _too_deep(body: dict[str, Any]) -> bool:
    url, depth = body.get("url"), body.get("maxDepth", 10)
    if not isinstance(url, str) or not isinstance(depth, int) or isinstance(depth, bool):
        return False
    try:
        path = urlsplit(url.strip()).path
    except ValueError:
        return False
    return len([part for part in path.split("/") if part]) > depth


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    """Keep every negative case and every positive one that keeps the rules above."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return True
    body = case.body
    if _waits_too_long(body) or _waits_too_long(body.get("scrapeOptions")):
        return False
    return not (case.path == "/v1/crawl" and _too_deep(body))
