# The feedback bodies firecrawl-mcp 3.26 sends, checked as plain values: a list of problems, each
# naming its field, so the route answers one 400 listing them all and stores nothing. The limits
# are the MCP's own (its zod schemas), so what the tool accepts crawld accepts too.
from __future__ import annotations

import re
from typing import Any

from daemon.crawl.options.schemas import SPACE
from daemon.crawl.problems import Problem, problem

RATINGS = ("good", "bad", "partial")
ENDPOINTS = ("search", "scrape", "parse", "map", "alexandria")
URL_PATTERN = rf"^https?://[^{SPACE}]+$"
"""An http(s) URL without white space (spelled out, as both regex engines read it alike); at
most MAX_URL characters."""
MAX_URL = 2048
CODE_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,79}$"
UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_URL = re.compile(URL_PATTERN)
_ISSUE = re.compile(CODE_PATTERN)
_UUID = re.compile(UUID_PATTERN)
_COMMON = frozenset({"rating", "valuableSources", "missingContent", "querySuggestions", "origin"})
SEARCH_KEYS = _COMMON
JOB_KEYS = _COMMON | {
    "endpoint", "jobId", "issues", "tags", "note", "url", "pageNumbers", "metadata",
    "requestedWebsite", "rationale", "providerFeedback", "capabilityFeedback",
}  # fmt: skip


def is_uuid(text: Any) -> bool:
    """A UUID in its usual form (8-4-4-4-12 hex digits)."""
    return isinstance(text, str) and _UUID.fullmatch(text) is not None


def _text(raw: dict[str, Any], key: str, most: int, out: list[Problem], path: str = "$") -> None:
    value = raw.get(key)
    if value is not None and (not isinstance(value, str) or len(value) > most):
        out.append(problem(f"{path}.{key}", f"a string of at most {most} characters"))


def _url(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_URL and _URL.fullmatch(value) is not None


def _list(raw: dict[str, Any], key: str, most: int, out: list[Problem]) -> list[Any]:
    value = raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > most:
        out.append(problem(f"$.{key}", f"a list of at most {most} entries"))
        return []
    return value


def _entries(raw: dict[str, Any], missing_most: int, out: list[Problem]) -> None:
    for i, item in enumerate(_list(raw, "valuableSources", 50, out)):
        path = f"$.valuableSources[{i}]"
        if not isinstance(item, dict) or set(item) - {"url", "reason"}:
            out.append(problem(path, "an object {url, reason?}"))
            continue
        if not _url(item.get("url")):
            out.append(problem(f"{path}.url", "an http(s) URL"))
        _text(item, "reason", 1000, out, path)
    for i, item in enumerate(_list(raw, "missingContent", missing_most, out)):
        path = f"$.missingContent[{i}]"
        if not isinstance(item, dict) or set(item) - {"topic", "description"}:
            out.append(problem(path, "an object {topic, description?}"))
            continue
        topic = item.get("topic")
        if not isinstance(topic, str) or not 1 <= len(topic) <= 200:
            out.append(problem(f"{path}.topic", "a string of 1 to 200 characters"))
        _text(item, "description", 2000, out, path)


def _common(raw: dict[str, Any], allowed: frozenset[str], missing_most: int) -> list[Problem]:
    out = [problem(f"$.{k}", "unknown key") for k in sorted(set(raw) - allowed)]
    if raw.get("rating") not in RATINGS:
        out.append(problem("$.rating", "one of good, bad, partial"))
    _entries(raw, missing_most, out)
    _text(raw, "querySuggestions", 2000, out)
    _text(raw, "origin", 200, out)
    return out


def search_problems(search_id: str, raw: dict[str, Any]) -> list[Problem]:
    """POST /v2/search/{searchId}/feedback: the id a UUID, the body as firecrawl-mcp sends it."""
    out = [] if is_uuid(search_id) else [problem("searchId", "the UUID of a search answer")]
    return out + _common(raw, SEARCH_KEYS, 20)


def _codes(raw: dict[str, Any], key: str, out: list[Problem]) -> None:
    for i, code in enumerate(_list(raw, key, 20, out)):
        if not isinstance(code, str) or not _ISSUE.fullmatch(code):
            out.append(problem(f"$.{key}[{i}]", "a code of lowercase letters, digits, _ or -"))


def job_problems(raw: dict[str, Any]) -> list[Problem]:
    """POST /v2/feedback: `endpoint` and `rating` always, `jobId` (a UUID) unless alexandria."""
    out = _common(raw, JOB_KEYS, 50)
    endpoint = raw.get("endpoint")
    if endpoint not in ENDPOINTS:
        out.append(problem("$.endpoint", "one of " + ", ".join(ENDPOINTS)))
    if endpoint != "alexandria" and not is_uuid(raw.get("jobId")):
        out.append(problem("$.jobId", "the UUID of a job (required unless endpoint is alexandria)"))
    _codes(raw, "issues", out)
    _codes(raw, "tags", out)
    _text(raw, "note", 4000, out)
    _text(raw, "rationale", 2000, out)
    if raw.get("url") is not None and not _url(raw["url"]):
        out.append(problem("$.url", "an http(s) URL"))
    pages = _list(raw, "pageNumbers", 100, out)
    if any(type(n) is not int or n < 1 for n in pages):
        out.append(problem("$.pageNumbers", "positive integers"))
    for key in ("metadata", "requestedWebsite"):
        if raw.get(key) is not None and not isinstance(raw[key], dict):
            out.append(problem(f"$.{key}", "an object"))
    for key in ("providerFeedback", "capabilityFeedback"):
        if any(not isinstance(x, dict) for x in _list(raw, key, 20, out)):
            out.append(problem(f"$.{key}", "a list of objects"))
    return out
