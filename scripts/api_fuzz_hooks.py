"""Schemathesis hooks of scripts/api_fuzz.py (loaded through SCHEMATHESIS_HOOKS): the rules of
crawld's request bodies that JSON Schema cannot state, kept by the cases schemathesis calls
valid. A `before_call` hook mends such a case just before it is sent (schemathesis then checks
the case again against the document), in every phase; invalid cases are left as they are, and
no check is touched. /openapi.json states each rule in the field's description:

- `waitFor` at most half of `timeout` when both are set (Firecrawl's rule), in scrape options
  wherever they sit in a body: waitFor becomes half of timeout;
- a v1 crawl's `url` has at most `maxDepth` path segments (Firecrawl's v1 rule): maxDepth
  becomes the URL's depth (a URL may come from another answer, in the stateful phase);
- an attributes format's selectors are CSS (crawld reads them with Lexbor): one that does not
  parse becomes `a[href]` (random text seldom is CSS);
- a monitor's schedule is a cron expression or one of Firecrawl's text forms, in an IANA zone,
  no more often than [monitors] min_interval: one that is not becomes daily at midnight UTC;
  its targets' ids are unique;
- a `schema` (extract's, the json format's, an agent's, changeTracking's) is a JSON Schema that
  compiles: one that does not (a keyword of the wrong type) becomes `{"type": "object"}`.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

import schemathesis

from daemon.crawl.content.attributes import parses
from daemon.crawl.monitors import models as monitors
from daemon.crawl.monitors.config import MonitorConfig
from daemon.llm.rules import schema_problem

CSS = "a[href]"
DAILY = {"cron": "0 0 * * *", "timezone": "UTC"}
MIN_INTERVAL_MS = int(float(MonitorConfig().min_interval) * 1000)
DEFAULT_MAX_DEPTH = 10


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _mend_options(options: Any) -> None:
    if not isinstance(options, dict):
        return
    wait, timeout = options.get("waitFor"), options.get("timeout")
    if _number(wait) and _number(timeout) and timeout > 0 and wait > timeout / 2:
        options["waitFor"] = int(timeout // 2)
    formats = options.get("formats")
    for fmt in formats if isinstance(formats, list) else []:
        if not isinstance(fmt, dict) or fmt.get("type") != "attributes":
            continue
        for item in fmt.get("selectors") or []:
            selector = item.get("selector") if isinstance(item, dict) else None
            if isinstance(selector, str) and selector.strip() and not parses(selector):
                item["selector"] = CSS


def _mend_everywhere(node: Any) -> None:
    """_mend_options on every object of a body (scrape options sit at its top, under
    `scrapeOptions`, in a monitor's targets), and every `schema` that does not compile."""
    if isinstance(node, dict):
        _mend_options(node)
        schema = node.get("schema")
        if isinstance(schema, dict) and schema_problem(schema):
            node["schema"] = {"type": "object"}
        for value in node.values():
            _mend_everywhere(value)
    elif isinstance(node, list):
        for value in node:
            _mend_everywhere(value)


def _mend_depth(body: dict[str, Any]) -> None:
    url, depth = body.get("url"), body.get("maxDepth", DEFAULT_MAX_DEPTH)
    if not isinstance(url, str) or not _number(depth):
        return
    try:
        path = urlsplit(url.strip()).path
    except ValueError:
        return
    segments = len([part for part in path.split("/") if part])
    if segments > depth:
        body["maxDepth"] = segments


def _mend_monitor(body: dict[str, Any]) -> None:
    if isinstance(body.get("schedule"), dict):
        now_ms = int(time.time() * 1000)
        _, problems = monitors._schedule(body["schedule"], "fuzz", MIN_INTERVAL_MS, now_ms)
        if problems:
            body["schedule"] = dict(DAILY)
    seen: set[Any] = set()
    for i, target in enumerate(body.get("targets") or []):
        if isinstance(target, dict) and target.get("id") is not None:
            if target["id"] in seen:
                target["id"] = f"{str(target['id'])[:100]}-{i}"
            seen.add(target["id"])


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """Mend a valid case (see the module's text); an invalid one is sent as generated."""
    meta = case.meta
    if meta is not None and not meta.generation.mode.is_positive:
        return
    body = case.body
    if not isinstance(body, dict):
        return
    _mend_everywhere(body)
    if case.operation.path == "/v1/crawl":
        _mend_depth(body)
    if case.operation.path.startswith("/v2/monitor"):
        _mend_monitor(body)
