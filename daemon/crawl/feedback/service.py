# Feedback as the API and the console need it: `record` validates (rules.py) before anything is
# written, so a bad body stores nothing; `listing` gives the newest first. crawld keeps no record
# of past searches, so a search feedback is accepted for any UUID (the id is stored as given).
from __future__ import annotations

import uuid
from typing import Any

import msgspec

from daemon.clock import EpochClock, wall_ms
from daemon.crawl.feedback import rules
from daemon.crawl.feedback import store as fstore
from daemon.crawl.problems import BadRequest
from daemon.store import Store


class FeedbackService:
    def __init__(self, store: Store, clock_ms: EpochClock = wall_ms) -> None:
        self.store = store
        self.clock_ms = clock_ms

    async def record_search(self, search_id: str, raw: dict[str, Any]) -> tuple[str, bool]:
        """The new feedback's id and whether that search had feedback before; BadRequest naming
        every bad field (nothing stored)."""
        if problems := rules.search_problems(search_id, raw):
            raise BadRequest(problems)
        return await self._insert("search", search_id, raw)

    async def record_job(self, raw: dict[str, Any]) -> tuple[str, bool]:
        """As record_search, for `POST /v2/feedback` (a job of `endpoint`, or alexandria)."""
        if problems := rules.job_problems(raw):
            raise BadRequest(problems)
        job = raw.get("jobId")  # any value with alexandria (the MCP's schema), kept in the body
        return await self._insert(raw["endpoint"], job if isinstance(job, str) else None, raw)

    async def _insert(
        self, endpoint: str, target: str | None, raw: dict[str, Any]
    ) -> tuple[str, bool]:
        row = fstore.FeedbackRow(id=str(uuid.uuid4()), endpoint=endpoint, target_id=target,
                                 rating=raw["rating"], body=msgspec.json.encode(raw),
                                 created_ms=self.clock_ms())  # fmt: skip

        def write(c: Any) -> bool:
            before = target is not None and fstore.exists_for(c, endpoint, target)
            fstore.insert(c, row)
            return before

        return row.id, await self.store.write(write)

    async def listing(self, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
        """The newest feedback first (`{id, endpoint, targetId, rating, createdMs, body}`) and
        how many are stored."""

        def read(c: Any) -> tuple[list[fstore.FeedbackRow], int]:
            return fstore.listing(c, limit, offset), fstore.count(c)

        rows, total = await self.store.read(read)
        return [_item(r) for r in rows], total


def _item(row: fstore.FeedbackRow) -> dict[str, Any]:
    return {"id": row.id, "endpoint": row.endpoint, "targetId": row.target_id,
            "rating": row.rating, "createdMs": row.created_ms,
            "body": msgspec.json.decode(row.body)}  # fmt: skip
