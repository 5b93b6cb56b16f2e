"""In-process fakes of the Bilibili client and the classifier for the engine's tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from daemon.clock import EpochClock
from daemon.tracker.bilibili import (
    BiliError,
    NoProxyAvailable,
    Stat,
    Timed,
    Uploader,
    UpstreamError,
    VideoDetail,
)
from daemon.tracker.classifier import Classification


def stat(views: int) -> Stat:
    return Stat(views=views, danmakus=0, replies=0, likes=0, coins=0, shares=0, favorites=0)


@dataclass
class FakeVideo:
    aid: int
    published_ms: int
    views: Callable[[int], int]
    title: str = "song"
    tags: list[str] = field(default_factory=lambda: ["VOCALOID"])
    gone: int | None = None


class FakeClient:
    def __init__(self, clock: EpochClock) -> None:
        self.clock = clock
        self.videos: dict[int, FakeVideo] = {}
        self.newest: list[int] = []
        self.requests: Counter[str] = Counter()
        self.fail: dict[str, list[Exception]] = {}

    def add(self, aid: int, views: Callable[[int], int], title: str = "song") -> FakeVideo:
        video = FakeVideo(aid, self.clock(), views, title)
        self.videos[aid] = video
        self.newest.insert(0, aid)
        return video

    def _timed(self, endpoint: str, value: object) -> Timed:  # type: ignore[type-arg]
        self.requests[endpoint] += 1
        errors = self.fail.get(endpoint)
        if errors:
            raise errors.pop(0)
        return Timed(value, self.clock(), "direct")

    async def newlist(self, pn: int, ps: int, rid: int = 30) -> Timed[list[int]]:
        return self._timed("newlist", self.newest[(pn - 1) * ps : pn * ps])

    def _video(self, aid: int) -> FakeVideo:
        video = self.videos.get(aid)
        if video is None:
            raise BiliError(-404, "not found")
        if video.gone is not None:
            raise BiliError(video.gone, "gone")
        return video

    async def view_detail(self, aid: int) -> Timed[VideoDetail]:
        timed = self._timed("view_detail", None)
        v = self._video(aid)
        detail = VideoDetail(
            aid=aid, bvid=f"BV{aid}", title=v.title, description="", tags=v.tags, duration=180,
            published_ms=v.published_ms, cover_url="", stat=stat(v.views(self.clock())),
            uploader=Uploader(uid=aid % 7, name="up", sign="", fans=1, face=""),
        )  # fmt: skip
        return Timed(detail, timed.server_ms, "direct")

    async def view_stat(self, aid: int) -> Timed[Stat]:
        timed = self._timed("view", None)
        return Timed(stat(self._video(aid).views(self.clock())), timed.server_ms, "direct")

    async def bulk_stats(self, aids: Sequence[int]) -> Timed[dict[int, Stat]]:
        timed = self._timed("bulk", None)
        now = self.clock()
        found = {
            a: stat(v.views(now))
            for a in aids
            if (v := self.videos.get(a)) is not None and v.gone is None
        }
        return Timed(found, timed.server_ms, "direct")


class ClassifierDown(Exception):
    pass


class FakeClassifier:
    def __init__(self) -> None:
        self.down = False
        self.calls = 0

    async def classify(
        self, aid: int, title: str, description: str, tags: list[str]
    ) -> Classification:
        self.calls += 1
        if self.down:
            raise ClassifierDown("down")
        song = "song" in title
        return Classification(
            1 if song else 0, [0.1, 0.9, 0.0] if song else [0.9, 0.1, 0.0], "fake-1"
        )


__all__ = ["NoProxyAvailable", "UpstreamError"]
