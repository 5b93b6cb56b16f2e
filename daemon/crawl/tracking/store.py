# changeTracking's state and effects: the markdown of the last scrape of each (URL, tag) in the
# store (table crawl_snapshots, migration 0015; tag '' is the null tag's bucket), read and
# replaced in one transaction so two instances scraping the same page each compare with what was
# there before them; and the `json` mode's LLM calls (daemon/llm/ through the daemon's
# LlmService, as the json format's). The rules are daemon/crawl/tracking/changes.py.
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from daemon.clock import EpochClock, wall_ms
from daemon.crawl.tracking import changes as tracking
from daemon.crawl.tracking.changes import TrackingSpec
from daemon.llm import LlmError
from daemon.logs import get_logger
from daemon.store import DB_ERRORS, Conn, Store, StoreClosed

log = get_logger("crawl")
_FAILURES: tuple[type[BaseException], ...] = (*DB_ERRORS, StoreClosed)
LOOKUP_WARNING = "Comparing failed, please try again later."


def swap(conn: Conn, url: str, tag: str, markdown: str, now_ms: int) -> tuple[str, int] | None:
    """The (markdown, scraped ms) kept for (url, tag), replaced by `markdown` at `now_ms`."""
    row = conn.execute(
        "SELECT markdown, scraped_ms FROM crawl_snapshots WHERE url = ? AND tag = ?", (url, tag)
    ).fetchone()
    conn.execute(
        "INSERT INTO crawl_snapshots (url, tag, scraped_ms, markdown) VALUES (?, ?, ?, ?)"
        " ON CONFLICT(url, tag) DO UPDATE SET scraped_ms = excluded.scraped_ms,"
        " markdown = excluded.markdown",
        (url, tag, now_ms, markdown),
    )
    return None if row is None else (str(row[0]), int(row[1]))


def iso(ms: int) -> str:
    """Firecrawl's previousScrapeAt form: `2025-06-01T10:00:00.000+00:00`."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _warn(document: dict[str, Any], text: str) -> None:
    existing = document.get("warning")
    document["warning"] = f"{existing} {text}" if existing else text


class ChangeTracker:
    def __init__(self, store: Store | None, clock_ms: EpochClock = wall_ms) -> None:
        self.store = store
        self.clock_ms = clock_ms
        self.counts: dict[str, int] = {"new": 0, "same": 0, "changed": 0, "removed": 0}

    async def apply(self, llm: Any, spec: TrackingSpec, url: str, document: dict[str, Any]
                    ) -> None:  # fmt: skip
        """Give `document` its `changeTracking` (or Firecrawl's warning when it cannot)."""
        if spec.zero_data_retention:
            _warn(document, tracking.ZDR_WARNING)
            return
        metadata = document.get("metadata") or {}
        key_url = str(metadata.get("sourceURL") or url)
        status_code = int(metadata.get("statusCode") or 200)
        current = str(document.get("markdown") or "")
        if self.store is None:
            _warn(document, LOOKUP_WARNING)
            return
        now, tag = self.clock_ms(), spec.tag or ""
        try:
            previous = await self.store.write(lambda c: swap(c, key_url, tag, current, now))
        except _FAILURES as exc:
            log.warning("change tracking snapshot not readable", error=str(exc))
            _warn(document, LOOKUP_WARNING)
            return
        before = previous[0] if previous is not None else None
        status = tracking.change_status(before, current, status_code)
        self.counts[status] += 1
        result: dict[str, Any] = {
            "previousScrapeAt": iso(previous[1]) if previous is not None else None,
            "changeStatus": status,
            "visibility": "visible",
        }
        if status == "changed" and before is not None:
            if "git-diff" in spec.modes:
                text = tracking.git_diff(before, current)
                result["diff"] = {"text": text, "json": tracking.parse_diff(text)}
            if "json" in spec.modes:
                value = await self._json(llm, spec, before, current)
                if value is None:
                    _warn(document, tracking.LLM_WARNING)
                else:
                    result["json"] = value
        document["changeTracking"] = result

    async def _json(self, llm: Any, spec: TrackingSpec, before: str, current: str) -> Any:
        if llm is None:
            return None
        if spec.schema is not None:
            try:
                old = await llm.extract_json(before, schema=spec.schema, prompt=spec.prompt)
                new = await llm.extract_json(current, schema=spec.schema, prompt=spec.prompt)
            except LlmError:
                pass
            else:
                return tracking.json_changes(old.value, new.value)
        try:
            answer = await llm.extract_json(
                tracking.comparison_content(before, current), schema=spec.schema,
                prompt=spec.prompt,
            )  # fmt: skip
        except LlmError as exc:
            log.warning("change tracking json failed", code=exc.code)
            return None
        return answer.value
