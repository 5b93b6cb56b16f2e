# Firecrawl's developer search (`GET /v2/search/developer?query&k&skills`, firecrawl-mcp's
# firecrawl_developer_search; `POST` with a JSON body, firecrawl-py's developer_search) answered by
# crawld's own search with `categories: ["developer"]` (code hosts, Q&A and documentation sites,
# daemon/search/rules.py): each web result becomes `{id, url, title, passages}`, its passages the
# highlights of the page (or its snippet). Firecrawl's own index (repository filters, stars,
# licences, agent-skill files) is not crawld's: those fields are a 400 "not supported by crawld",
# never a silently unfiltered answer. Plain values in and out; the route calls the search.
from __future__ import annotations

import hashlib
import re
from typing import Any

from daemon.crawl.problems import BadRequest, Problem, not_supported, problem

SEPARATOR = "\n\n"
"""Between the passages of a highlights description (daemon/crawl/llmwork/rules.py)."""
UNSUPPORTED = ("types", "repos", "sources", "language", "topic", "license", "min_stars",
               "max_stars", "archived", "fork", "skills")  # fmt: skip
"""firecrawl-py's filters over Firecrawl's developer index, which crawld does not have."""
KEYS = frozenset({"query", "k", "passages", "origin", *UNSUPPORTED})
_GITHUB = re.compile(
    r"https?://(?:www\.)?github\.com/([^/?#]+/[^/?#]+)(?:/(issues|pull)/(\d+))?/?$"
)


def _int(
    raw: dict[str, Any], key: str, low: int, high: int, out: list[Problem], from_query: bool
) -> int | None:
    value = raw.get(key)
    if from_query and isinstance(value, str) and re.fullmatch(r"[0-9]{1,6}", value):
        value = int(value)
    if value is None:
        return None
    if type(value) is not int or not low <= value <= high:
        out.append(problem(f"$.{key}", f"an integer between {low} and {high}"))
        return None
    return value


def search_body(raw: dict[str, Any], *, from_query: bool = False) -> tuple[dict[str, Any], int]:
    """The POST /v2/search body for a developer search and the passages wanted per result
    (default 3); BadRequest naming every bad field. `from_query`: `raw` holds a query string's
    values (k and passages as digits)."""
    out = [problem(f"$.{k}", "unknown key") for k in sorted(set(raw) - KEYS)]
    out += [problem(f"$.{k}", not_supported(f"developer search {k!r}"))
            for k in UNSUPPORTED if raw.get(k) is not None]  # fmt: skip
    query = raw.get("query")
    if not isinstance(query, str) or not query.strip():
        out.append(problem("$.query", "a non-empty string"))
    k = _int(raw, "k", 1, 100, out, from_query)
    passages = _int(raw, "passages", 1, 5, out, from_query)
    if out:
        raise BadRequest(out)
    return {"query": query, "limit": k or 10, "categories": ["developer"]}, passages or 3


def result_id(url: str) -> str:
    """Firecrawl's result ids: `issue:owner/repo#12`, `pr:owner/repo#12`, `readme:owner/repo`
    for GitHub; `doc:<hash of the URL>` for any other page."""
    if found := _GITHUB.match(url):
        repo, kind, number = found.groups()
        if kind:
            return f"{'issue' if kind == 'issues' else 'pr'}:{repo}#{number}"
        return f"readme:{repo}"
    return "doc:" + hashlib.sha256(url.encode()).hexdigest()[:16]


def results(search_answer: dict[str, Any], passages: int) -> list[dict[str, Any]]:
    """The web results of a search answer as developer-search results, in rank order."""
    out = []
    for item in search_answer.get("data", {}).get("web", []):
        text = item.get("description") or ""
        kept = [p for p in text.split(SEPARATOR) if p.strip()][:passages]
        out.append({"id": result_id(item["url"]), "url": item["url"],
                    "title": item.get("title") or item["url"],
                    "passages": [{"text": p} for p in kept]})  # fmt: skip
    return out
