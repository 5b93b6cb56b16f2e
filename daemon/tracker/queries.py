# The tracker's reads for the surfaces (the HTTP API's /tracker routes and the web console):
# each one reader transaction over the store, written once here so neither surface runs the
# tracker's SQL, and the one rule for what a video id in a path may look like.
from __future__ import annotations

from typing import Any

from daemon.store import Conn, Store
from daemon.tracker import store as ts

MAX_AID = 2**62
"""The largest av number a path, a body or a search takes."""


def parse_aid(raw: str) -> int | None:
    """The av number in `raw` ("123" or "av123", any case), or None when it is not one."""
    text = raw[2:] if raw.lower().startswith("av") else raw
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_AID:
        return None
    return int(text)


class TrackerQueries:
    """The tracker's tables as the surfaces read them (reader connections only)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def video(self, aid: int) -> dict[str, Any] | None:
        """What `GET /tracker/videos/{aid}` shows, or None for an aid not tracked."""
        return await self.store.read(lambda c: ts.video_info(c, aid))

    async def snapshots(
        self, aid: int, since_ms: int, until_ms: int, limit: int
    ) -> list[tuple[int, ...]] | None:
        """A video's snapshot rows (at_ms, views, danmakus, replies, likes, coins, shares,
        favorites), oldest first, in [since_ms, until_ms], up to `limit`; None for an aid not
        tracked (read in the same snapshot of the store)."""

        def read(conn: Conn) -> list[tuple[int, ...]] | None:
            if ts.video_status(conn, aid) is None:
                return None
            return ts.snapshots(conn, aid, since_ms, until_ms, limit)

        return await self.store.read(read)

    async def search(self, query: str, limit: int) -> list[dict[str, Any]]:
        """Tracked videos matching `query` (an aid, avNNN, or words of the title or uploader),
        newest first."""
        return await self.store.read(lambda c: ts.search_videos(c, query, limit))

    async def closest_to_milestone(self, limit: int) -> list[dict[str, Any]]:
        """Songs with their views and ETA, soonest to their next milestone first."""
        return await self.store.read(lambda c: ts.closest_to_milestone(c, limit))
