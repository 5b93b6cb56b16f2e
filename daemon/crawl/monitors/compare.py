# A monitor page's status against its previous snapshot, and a check's summary and status, as
# pure rules. The "same" test and the diff are changeTracking's (daemon/crawl/tracking/changes.py:
# whitespace and [iframe] links ignored; unified hunks, and parse-diff's structure as `diff.json`),
# so a page reads the same through both features.
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from daemon.crawl.fetching.urls import compile_paths
from daemon.crawl.tracking.changes import comparable, git_diff, parse_diff

GONE_CODES = frozenset({404, 410})
PAGE_STATUSES = ("same", "new", "changed", "removed", "error")


@dataclass(frozen=True)
class Previous:
    """The last snapshot of a page under one target: its markdown, or gone (removed)."""

    scrape_id: str
    markdown: str
    gone: bool


@dataclass(frozen=True)
class Outcome:
    status: str
    diff: dict[str, Any] | None = None
    error: str | None = None
    keep: bool = False
    """Whether the snapshot becomes this fetch's (markdown), or (with `gone`) marked gone."""
    gone: bool = False


def without_noise(markdown: str, patterns: tuple[str, ...]) -> str:
    """The markdown with every match of the target's `ignorePatterns` (RE2 regexes: dates,
    counters, ads) removed, and lines left empty by that dropped: what is compared, diffed and
    kept as the snapshot, so noise never makes a page `changed`."""
    if not patterns:
        return markdown
    lines = []
    for line in markdown.splitlines(keepends=True):
        kept = line
        for pattern in compile_paths(patterns, field="ignorePatterns"):
            kept = pattern.sub("", kept)
        if kept.strip() or not line.strip():
            lines.append(kept)
    return "".join(lines)


def page_outcome(
    previous: Previous | None, markdown: str | None, status_code: int | None, error: str | None
) -> Outcome:
    """The page's status: `error` when it could not be fetched (or answered an error other than
    404/410, or 404/410 before it was ever seen); `removed` on 404/410 after it was seen (once:
    a page already removed stays `same`); `new` at first sight or on coming back; `same` or
    `changed` (with the diff) against the previous markdown."""
    if error is not None or markdown is None:
        return Outcome("error", error=error or "no content")
    code = status_code or 200
    if code in GONE_CODES:
        if previous is None:
            return Outcome("error", error=f"the page answered HTTP {code}")
        if previous.gone:
            return Outcome("same")
        return Outcome("removed", keep=True, gone=True)
    if code >= 400:
        return Outcome("error", error=f"the page answered HTTP {code}")
    if previous is None or previous.gone:
        return Outcome("new", keep=True)
    if comparable(previous.markdown) == comparable(markdown):
        return Outcome("same", keep=True)
    text = git_diff(previous.markdown, markdown)
    return Outcome("changed", diff={"text": text, "json": parse_diff(text)}, keep=True)


def summary(statuses: Iterable[str]) -> dict[str, int]:
    """Firecrawl's summary counts."""
    counts = dict.fromkeys(PAGE_STATUSES, 0)
    total = 0
    for status in statuses:
        counts[status] += 1
        total += 1
    return {"totalPages": total, **counts}


def check_status(counts: dict[str, int], target_errors: int) -> str:
    """`completed`; `partial` when some page (or target) failed; `failed` when every page did
    (or no page could be checked because every target failed)."""
    total = counts["totalPages"]
    if (total and counts["error"] == total) or (not total and target_errors):
        return "failed"
    if counts["error"] or target_errors:
        return "partial"
    return "completed"
