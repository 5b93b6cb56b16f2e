# A Bilibili simulator: a real HTTP server speaking the four endpoints the tracker reads, with
# the reference's envelopes and shapes, so the client, the delegate and the whole tracker are
# tested (and demonstrated, and benchmarked) over real sockets.
#
# Time comes from a clock function shared with the test (`trio_epoch_clock` under autojump), and
# every number the simulator answers is a pure function of that time: a video's views follow its
# `Curve` from its publication instant, and a video appears in `newlist` (newest first) once its
# publication instant has passed, so a test moves the clock and sees videos published and views
# grow without any background task. Requests are rate limited by client address with the same
# exact GCRA windows the tracker's delegate uses (`daemon.net.ratelimit`), answering Bilibili's
# HTTP 412 / code -412 and counting every such answer: a client that keeps its limits sees none.
# `/_sim/relay[/{name}]` acts as a relay proxy (`{url}` → `{statusCode, body, serverTime}`) for
# the simulated endpoints only (it never fetches anything else), each relay name a client address
# of its own, so several proxies are testable offline. State changes happen in handlers without
# awaiting in between, so they are atomic under trio.
#
#   python -m daemon.fakes.bilibili --bind 127.0.0.1:8702 --videos 300 --publish-every 20s
from __future__ import annotations

import argparse
import bisect
import collections
import math
import random
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import msgspec
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from daemon.api.errors import HTTPError, JSONResponse, handle_http_error, read_json_body
from daemon.clock import EpochClock, wall_ms
from daemon.fakes.serving import run_standalone, serve_fake
from daemon.net.ratelimit import Window, reserve_all
from daemon.tracker.config import DEFAULT_BULK_LIMITS, DEFAULT_LIMITS, Limit

HOUR_MS = 3_600_000
Endpoint = Literal["newlist", "view", "view_detail", "bulk"]
ENDPOINTS: dict[str, Endpoint] = {
    "/x/web-interface/newlist": "newlist",
    "/x/web-interface/view": "view",
    "/x/web-interface/view/detail": "view_detail",
    "/medialist/gateway/base/resource/infos": "bulk",
}
GONE_MESSAGES = {-404: "啥都木有", 62002: "稿件不可见", 62012: "仅UP主自己可见"}
MAX_BULK = 50
MAX_PAGE_SIZE = 50


# ---- view curves (pure) -----------------------------------------------------------------------


class Curve(msgspec.Struct, frozen=True, kw_only=True):
    """Views as a function of the time since publication.

    linear: `start + per_hour·h`; decaying: `start + total·(1 − 2^(−h/half_life_h))` (most views in
    the first days); viral: `start + per_hour·h` plus a logistic burst of `total` views centred
    `burst_at_h` after publication, `burst_width_h` wide."""

    kind: Literal["linear", "decaying", "viral"] = "linear"
    start: int = 0
    per_hour: float = 0.0
    total: float = 0.0
    half_life_h: float = 24.0
    burst_at_h: float = 24.0
    burst_width_h: float = 2.0

    @classmethod
    def linear(cls, per_hour: float, start: int = 0) -> Curve:
        return cls(kind="linear", per_hour=per_hour, start=start)

    @classmethod
    def decaying(cls, total: float, half_life_h: float = 24.0, start: int = 0) -> Curve:
        return cls(kind="decaying", total=total, half_life_h=half_life_h, start=start)

    @classmethod
    def viral(
        cls,
        total: float,
        burst_at_h: float,
        burst_width_h: float = 2.0,
        per_hour: float = 0.0,
        start: int = 0,
    ) -> Curve:
        return cls(
            kind="viral",
            total=total,
            burst_at_h=burst_at_h,
            burst_width_h=burst_width_h,
            per_hour=per_hour,
            start=start,
        )

    def __post_init__(self) -> None:
        if self.start < 0 or self.per_hour < 0 or self.total < 0:
            raise ValueError("a curve's start, per_hour and total must not be negative")
        if self.half_life_h <= 0 or self.burst_width_h <= 0:
            raise ValueError("half_life_h and burst_width_h must be positive")

    def views(self, age_ms: int) -> int:
        """Views `age_ms` after publication (0 before it); never decreasing in `age_ms`."""
        if age_ms <= 0:
            return self.start if age_ms == 0 else 0
        h = age_ms / HOUR_MS
        if self.kind == "linear":
            extra = self.per_hour * h
        elif self.kind == "decaying":
            extra = self.total * (1 - 2 ** (-h / self.half_life_h))
        else:
            extra = self.per_hour * h + self.total * (
                _logistic((h - self.burst_at_h) / self.burst_width_h)
                - _logistic(-self.burst_at_h / self.burst_width_h)
            )
        return self.start + int(extra)


def _logistic(x: float) -> float:
    if x < -60:
        return 0.0
    return 1 / (1 + math.exp(-x))


def stat_for(views: int) -> dict[str, int]:
    """The other counters, derived from views so every answer of a video is consistent."""
    return {
        "view": views,
        "danmaku": views // 50,
        "reply": views // 100,
        "favorite": views // 30,
        "coin": views // 40,
        "share": views // 200,
        "like": views // 20,
    }


_BV_TABLE = "fZodR9XQDSUm21yCkr6zBqiveYah8bt4xsWpHnJE7jL5VG3guMTKNPAwcF"
_BV_SLOTS = (11, 10, 3, 8, 4, 6)


def bvid_of(aid: int) -> str:
    """The classic av→BV mapping (exact for aids below 2^29, distinct for the rest)."""
    x = (aid ^ 177451812) + 8728348608
    chars = list("BV1  4 1 7  ")
    for i, slot in enumerate(_BV_SLOTS):
        chars[slot] = _BV_TABLE[x // 58**i % 58]
    return "".join(chars)


# ---- videos -----------------------------------------------------------------------------------


class SimUploader(msgspec.Struct, kw_only=True):
    mid: int
    name: str
    sign: str = ""
    fans: int = 0
    face: str = ""


class SimVideo(msgspec.Struct, kw_only=True):
    aid: int
    title: str
    description: str
    tags: list[tuple[str, str]]
    """(tag_name, tag_type) as Bilibili returns them."""
    duration: int
    published_ms: int
    uploader: SimUploader
    curve: Curve
    song: bool
    """What a perfect classifier would say (for checking a pipeline's labels)."""
    gone: int = 0
    """0, or the code every answer about this video gives (-404, 62002, 62012)."""

    @property
    def bvid(self) -> str:
        return bvid_of(self.aid)

    def views(self, at_ms: int) -> int:
        return self.curve.views(at_ms - self.published_ms)


_SINGERS = [
    "洛天依",
    "言和",
    "乐正绫",
    "乐正龙牙",
    "徵羽摩柯",
    "墨清弦",
    "星尘",
    "初音未来",
    "心华",
]
_WORDS = ["星河", "不夜城", "霜雪千年", "归去来兮", "夏日", "光", "梦游", "长安", "雨后", "回声"]
_NON_SONGS = [
    ("【MMD】{s}的日常", ["MMD", "3D"]),
    ("{s}生日会 直播回放", ["直播", "生日"]),
    ("【手书】{w}", ["手书", "绘画"]),
    ("{s} 周边开箱", ["开箱", "周边"]),
    ("VOCALOID 调教教程 第{n}期", ["教程", "调教"]),
]
_SONGS = [
    ("【{s}原创】{w}", ["原创", "VOCALOID中文曲"], "作词：某某 作曲：某某 原创曲"),
    ("【{s}】{w}（翻唱）", ["翻唱", "VOCALOID"], "翻唱自某曲"),
    ("【{s}】{w} - cover", ["cover", "虚拟歌手"], "cover"),
    ("【{s}原创曲】{w}", ["原创", "中V"], "原创 PV付"),
    ("【{s}】{w} remix", ["remix", "VOCALOID中文曲"], "remix"),
]


class _Fault(msgspec.Struct, kw_only=True):
    code: int | None = None
    http_status: int | None = None
    remaining: int = 1


class BilibiliSim:
    """State and controls of the simulated Bilibili; `app` serves it."""

    def __init__(
        self,
        clock: EpochClock = wall_ms,
        *,
        seed: int = 0,
        limits: list[Limit] | None = None,
        bulk_limits: list[Limit] | None = None,
        latency_ms: tuple[int, int] = (0, 0),
        transit_ms: tuple[int, int] = (0, 0),
    ) -> None:
        self.clock = clock
        self.rng = random.Random(seed)
        self.windows = [Window(lim.requests, round(lim.per * 1000)) for lim in
                        (DEFAULT_LIMITS if limits is None else limits)]  # fmt: skip
        """Limits per client address on every endpoint (empty: no rate limiting)."""
        self.bulk_windows = [Window(lim.requests, round(lim.per * 1000)) for lim in
                             (bulk_limits or [])]  # fmt: skip
        """Extra limits on the bulk endpoint."""
        self.latency_ms = latency_ms
        """(least, most) ms before each answer, uniformly drawn."""
        self.transit_ms = transit_ms
        """(least, most) ms a request takes to arrive, before the rate limit sees it: uneven
        transit brings requests closer together than they were sent."""
        self.videos: dict[int, SimVideo] = {}
        self._by_time: list[tuple[int, int]] = []
        """(published_ms, aid) of every video, ascending: newlist reads it from the end."""
        self.requests: collections.Counter[str] = collections.Counter()
        """Requests per endpoint ("newlist", "view", "view_detail", "bulk", "relay")."""
        self.requests_by_client: collections.Counter[str] = collections.Counter()
        self.rejected_412 = 0
        self.rejected_by_client: collections.Counter[str] = collections.Counter()
        self.faults_served: collections.Counter[str] = collections.Counter()
        self._faults: dict[str, list[_Fault]] = collections.defaultdict(list)
        self._tats: dict[str, list[int]] = {}
        self._next_aid = 1_000_000 + self.rng.randrange(1000)
        self._uploaders = [
            SimUploader(
                mid=10_000 + i,
                name=f"UP主{i:02d}",
                sign=f"第{i}号制作人",
                fans=self.rng.randrange(10, 200_000),
                face=f"https://i0.hdslb.com/bfs/face/{i:04d}.jpg",
            )
            for i in range(40)
        ]
        self._stream: tuple[int, int, float] | None = None
        self._streamed = 0
        self.app = self._build_app()

    # ---- controls -------------------------------------------------------------------------

    def add_video(
        self,
        *,
        aid: int | None = None,
        title: str | None = None,
        description: str = "",
        tags: list[str] | list[tuple[str, str]] | None = None,
        published_ms: int | None = None,
        curve: Curve | None = None,
        song: bool = True,
        duration: int = 200,
        uploader: int | None = None,
    ) -> int:
        """Add a video (published now unless `published_ms` says otherwise); returns its aid.

        Unspecified fields are drawn from the simulator's seed: a song or a non-song title and
        tags in the style of the VOCALOID·UTAU zone, and a decaying curve."""
        if aid is None:
            aid = self._next_aid
        if aid in self.videos:
            raise ValueError(f"video {aid} exists")
        self._next_aid = max(self._next_aid, aid) + 1 + self.rng.randrange(30)
        rng = self.rng
        singer, word = rng.choice(_SINGERS), rng.choice(_WORDS)
        if title is None:
            if song:
                pattern, default_tags, desc = rng.choice(_SONGS)
                description = description or desc
            else:
                pattern, default_tags = rng.choice(_NON_SONGS)
            title = pattern.format(s=singer, w=word, n=rng.randrange(1, 40))
            if tags is None:
                tags = [singer, *default_tags]
        pairs = [t if isinstance(t, tuple) else (t, "old_channel") for t in tags or []]
        video = SimVideo(
            aid=aid,
            title=title,
            description=description,
            tags=pairs,
            duration=duration,
            published_ms=self.clock() if published_ms is None else published_ms,
            uploader=self._uploaders[
                uploader if uploader is not None else rng.randrange(len(self._uploaders))
            ],
            curve=curve or Curve.decaying(total=rng.choice([300, 2000, 20_000, 150_000])),
            song=song,
        )
        self.videos[aid] = video
        bisect.insort(self._by_time, (video.published_ms, aid))
        return aid

    def publish(self, count: int = 1, *, song_share: float = 0.5) -> list[int]:
        """Publish `count` generated videos now (into newlist, newest first); their aids."""
        return [self.add_video(song=self.rng.random() < song_share) for _ in range(count)]

    def stream(self, every_ms: int, *, song_share: float = 0.5) -> None:
        """From now on, a generated video is published every `every_ms` (materialised lazily,
        so what exists is a pure function of the clock)."""
        if every_ms < 1:
            raise ValueError("every_ms must be positive")
        self._catch_up()
        self._stream = (self.clock(), every_ms, song_share)
        self._streamed = 0

    def _catch_up(self) -> None:
        if self._stream is None:
            return
        since, every, share = self._stream
        due = (self.clock() - since) // every
        while self._streamed < due:
            self._streamed += 1
            self.add_video(published_ms=since + self._streamed * every,
                           song=self.rng.random() < share)  # fmt: skip

    def set_curve(self, aid: int, curve: Curve) -> None:
        self.video(aid).curve = curve

    def delete(self, aid: int, code: int = -404) -> None:
        """The video answers `code` from now on and leaves newlist and bulk answers."""
        if code not in GONE_MESSAGES:
            raise ValueError(f"code must be one of {sorted(GONE_MESSAGES)}")
        self.video(aid).gone = code

    def inject(
        self,
        endpoint: str,
        code: int | None = None,
        *,
        http_status: int | None = None,
        times: int = 1,
    ) -> None:
        """Answer the next `times` requests to `endpoint` with Bilibili `code` (HTTP 200) or
        with HTTP `http_status` (and no envelope)."""
        if endpoint not in ENDPOINTS.values():
            raise ValueError(f"endpoint must be one of {sorted(ENDPOINTS.values())}")
        if (code is None) == (http_status is None):
            raise ValueError("give either code or http_status")
        if times < 1:
            raise ValueError("times must be at least 1")
        self._faults[endpoint].append(_Fault(code=code, http_status=http_status, remaining=times))

    def video(self, aid: int) -> SimVideo:
        try:
            return self.videos[aid]
        except KeyError:
            raise KeyError(f"unknown video {aid}") from None

    def views(self, aid: int, at_ms: int | None = None) -> int:
        return self.video(aid).views(self.clock() if at_ms is None else at_ms)

    def stats(self) -> dict[str, Any]:
        self._catch_up()
        now = self.clock()
        return {
            "now_ms": now,
            "videos": len(self.videos),
            "published": bisect.bisect_right(self._by_time, (now, math.inf)),
            "gone": sum(1 for v in self.videos.values() if v.gone),
            "requests": dict(self.requests),
            "requests_by_client": dict(self.requests_by_client),
            "rejected_412": self.rejected_412,
            "faults_served": dict(self.faults_served),
            "latency_ms": list(self.latency_ms),
        }

    # ---- rate limiting ----------------------------------------------------------------------

    def _admit(self, client: str, endpoint: str, now: int) -> bool:
        windows = self.windows + (self.bulk_windows if endpoint == "bulk" else [])
        if not windows:
            return True
        tats = self._tats.get(client)
        if tats is None:
            every = self.windows + self.bulk_windows
            tats = self._tats[client] = [w.scaled(now) for w in every]  # a full burst
        current = tats[: len(windows)]
        reserved = reserve_all(current, now, windows)
        if reserved is None:
            return False
        tats[: len(windows)] = reserved
        return True

    # ---- answers ----------------------------------------------------------------------------

    async def answer(self, path: str, query: Mapping[str, str], client: str) -> tuple[int, bytes]:
        """(HTTP status, body) for a GET of a simulated endpoint by `client`."""
        endpoint = ENDPOINTS.get(path)
        if endpoint is None:
            return 404, _encode({"code": -404, "message": "啥都木有", "ttl": 1})
        if self.transit_ms[1] > 0:
            await trio.sleep(self.rng.uniform(*self.transit_ms) / 1000)
        self.requests[endpoint] += 1
        self.requests_by_client[client] += 1
        if not self._admit(client, endpoint, self.clock()):
            self.rejected_412 += 1
            self.rejected_by_client[client] += 1
            return 412, _encode({"code": -412, "message": "请求被拦截", "ttl": 1, "data": None})
        least, most = self.latency_ms
        delay = self.rng.uniform(least, most) / 1000 if most > 0 else 0.0
        if delay:
            await trio.sleep(delay / 2)
        status, body = self._answer_now(endpoint, query)
        if delay:
            await trio.sleep(delay / 2)
        return status, body

    def _answer_now(self, endpoint: Endpoint, query: Mapping[str, str]) -> tuple[int, bytes]:
        faults = self._faults.get(endpoint)
        if faults:
            fault = faults[0]
            fault.remaining -= 1
            if fault.remaining <= 0:
                faults.pop(0)
            if fault.http_status is not None:
                self.faults_served[f"{endpoint} HTTP {fault.http_status}"] += 1
                return fault.http_status, b"<html>simulated upstream failure</html>"
            self.faults_served[f"{endpoint} code {fault.code}"] += 1
            return 200, _encode({"code": fault.code, "message": "simulated", "ttl": 1})
        self._catch_up()
        try:
            if endpoint == "newlist":
                data: Any = self._newlist(query)
            elif endpoint == "bulk":
                data = self._bulk(query)
            else:
                video = self._visible(_int_param(query, "aid"))
                data = self._view(video) if endpoint == "view" else self._detail(video)
        except _BadRequest:
            return 200, _encode({"code": -400, "message": "请求错误", "ttl": 1})
        except _Gone as gone:
            return 200, _encode({"code": gone.code, "message": GONE_MESSAGES[gone.code], "ttl": 1})
        return 200, _encode({"code": 0, "message": "0", "ttl": 1, "data": data})

    def _visible(self, aid: int) -> SimVideo:
        video = self.videos.get(aid)
        if video is None or video.published_ms > self.clock():
            raise _Gone(-404)
        if video.gone:
            raise _Gone(video.gone)
        return video

    def _owner(self, video: SimVideo) -> dict[str, Any]:
        up = video.uploader
        return {"mid": up.mid, "name": up.name, "face": up.face}

    def _view(self, video: SimVideo) -> dict[str, Any]:
        views = video.views(self.clock())
        return {
            "aid": video.aid,
            "bvid": video.bvid,
            "tid": 30,
            "tname": "VOCALOID·UTAU",
            "title": video.title,
            "pic": f"http://i0.hdslb.com/bfs/archive/{video.bvid}.jpg",
            "pubdate": video.published_ms // 1000,
            "ctime": video.published_ms // 1000,
            "desc": video.description,
            "state": 0,
            "duration": video.duration,
            "owner": self._owner(video),
            "stat": {"aid": video.aid, **stat_for(views), "now_rank": 0, "his_rank": 0},
        }

    def _detail(self, video: SimVideo) -> dict[str, Any]:
        up = video.uploader
        return {
            "View": self._view(video),
            "Card": {
                "card": {
                    "mid": str(up.mid),
                    "name": up.name,
                    "sign": up.sign,
                    "face": up.face,
                    "fans": up.fans,
                },
                "follower": up.fans,
                "archive_count": 10,
            },
            "Tags": [
                {"tag_id": 1000 + i, "tag_name": name, "tag_type": tag_type}
                for i, (name, tag_type) in enumerate(video.tags)
            ],
            "Related": [],
        }

    def _newlist(self, query: Mapping[str, str]) -> dict[str, Any]:
        if query.get("rid", "30") != "30":
            return {"archives": [], "page": {"count": 0, "num": 1, "size": 0}}
        ps = _int_param(query, "ps", 20)
        pn = _int_param(query, "pn", 1)
        if not 1 <= ps <= MAX_PAGE_SIZE or pn < 1:
            raise _BadRequest
        now = self.clock()
        end = bisect.bisect_right(self._by_time, (now, math.inf))
        skip, count = (pn - 1) * ps, 0
        page: list[SimVideo] = []
        for i in range(end - 1, -1, -1):
            video = self.videos[self._by_time[i][1]]
            if video.gone:
                continue
            if count >= skip and len(page) < ps:
                page.append(video)
            count += 1
            if len(page) >= ps:
                break
        return {
            "archives": [
                {
                    "aid": v.aid,
                    "bvid": v.bvid,
                    "tid": 30,
                    "title": v.title,
                    "pubdate": v.published_ms // 1000,
                    "duration": v.duration,
                    "owner": self._owner(v),
                    "stat": stat_for(v.views(now)),
                }
                for v in page
            ],
            "page": {"count": end, "num": pn, "size": ps},
        }

    def _bulk(self, query: Mapping[str, str]) -> list[dict[str, Any]]:
        raw = query.get("resources", "")
        aids = []
        for item in raw.split(","):
            if not item:
                continue
            digits, _, kind = item.partition(":")
            if kind != "2" or not digits.isdigit():
                raise _BadRequest
            aids.append(int(digits))
        if not 1 <= len(aids) <= MAX_BULK:
            raise _BadRequest
        now = self.clock()
        found = []
        for aid in aids:
            video = self.videos.get(aid)
            if video is None or video.gone or video.published_ms > now:
                continue
            s = stat_for(video.views(now))
            found.append(
                {
                    "id": aid,
                    "bvid": video.bvid,
                    "type": 2,
                    "attr": 0,
                    "title": video.title,
                    "cnt_info": {"play": s["view"], "danmaku": s["danmaku"],
                                 "reply": s["reply"], "thumb_up": s["like"], "coin": s["coin"],
                                 "share": s["share"], "collect": s["favorite"]},
                }
            )  # fmt: skip
        return found

    # ---- HTTP -------------------------------------------------------------------------------

    async def _endpoint(self, request: Request) -> Response:
        client = request.client.host if request.client else "unknown"
        status, body = await self.answer(request.url.path, dict(request.query_params), client)
        media = "application/json" if body.startswith(b"{") else "text/html"
        return Response(body, status_code=status, media_type=media)

    async def _relay(self, request: Request) -> Response:
        spec = await read_json_body(request, _Relay, empty_ok=False)
        name = request.path_params.get("name", "default")
        self.requests["relay"] += 1
        parts = urlsplit(spec.url)
        if parts.path not in ENDPOINTS:
            return JSONResponse(
                {"statusCode": 502, "body": "the relay only reaches the simulated endpoints",
                 "serverTime": self.clock()}
            )  # fmt: skip
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        started = self.clock()
        status, body = await self.answer(parts.path, query, f"relay:{name}")
        finished = self.clock()
        return JSONResponse(
            {"statusCode": status, "body": body.decode(), "serverTime": (started + finished) // 2}
        )

    async def _sim_stats(self, request: Request) -> Response:
        return JSONResponse(self.stats())

    async def _sim_add(self, request: Request) -> Response:
        spec = await read_json_body(request, _AddVideo)
        try:
            aid = self.add_video(
                aid=spec.aid,
                title=spec.title,
                description=spec.description,
                tags=spec.tags,
                published_ms=spec.published_ms,
                curve=spec.curve,
                song=spec.song,
                duration=spec.duration,
            )
        except ValueError as exc:
            raise HTTPError(409, str(exc), {"aid": spec.aid}) from None
        return JSONResponse(self._describe(aid))

    async def _sim_publish(self, request: Request) -> Response:
        spec = await read_json_body(request, _Publish)
        if not 1 <= spec.count <= 10_000:
            raise HTTPError(422, "count must be between 1 and 10000", {"count": spec.count})
        return JSONResponse({"aids": self.publish(spec.count, song_share=spec.song_share)})

    def _sim_video(self, request: Request) -> SimVideo:
        raw = request.path_params["aid"]
        try:
            return self.video(int(raw))
        except (KeyError, ValueError):
            raise HTTPError(404, "unknown video", {"aid": raw[:40]}) from None

    def _describe(self, aid: int) -> dict[str, Any]:
        video = self.video(aid)
        return {
            "aid": aid,
            "bvid": video.bvid,
            "title": video.title,
            "song": video.song,
            "published_ms": video.published_ms,
            "gone": video.gone,
            "views": video.views(self.clock()),
            "curve": msgspec.to_builtins(video.curve),
        }

    async def _sim_get_video(self, request: Request) -> Response:
        return JSONResponse(self._describe(self._sim_video(request).aid))

    async def _sim_curve(self, request: Request) -> Response:
        video = self._sim_video(request)
        self.set_curve(video.aid, await read_json_body(request, Curve, empty_ok=False))
        return JSONResponse(self._describe(video.aid))

    async def _sim_delete(self, request: Request) -> Response:
        video = self._sim_video(request)
        spec = await read_json_body(request, _Delete)
        try:
            self.delete(video.aid, spec.code)
        except ValueError as exc:
            raise HTTPError(422, str(exc), {"code": spec.code}) from None
        return JSONResponse(self._describe(video.aid))

    async def _sim_inject(self, request: Request) -> Response:
        spec = await read_json_body(request, _Inject, empty_ok=False)
        try:
            self.inject(spec.endpoint, spec.code, http_status=spec.http_status, times=spec.times)
        except ValueError as exc:
            raise HTTPError(422, str(exc), msgspec.to_builtins(spec)) from None
        return JSONResponse({"pending": {k: sum(f.remaining for f in v)
                                         for k, v in self._faults.items() if v}})  # fmt: skip

    async def _sim_latency(self, request: Request) -> Response:
        spec = await read_json_body(request, _Latency, empty_ok=False)
        if not 0 <= spec.min_ms <= spec.max_ms <= 60_000:
            raise HTTPError(422, "need 0 <= min_ms <= max_ms <= 60000", msgspec.to_builtins(spec))
        self.latency_ms = (spec.min_ms, spec.max_ms)
        return JSONResponse({"latency_ms": list(self.latency_ms)})

    def _build_app(self) -> Starlette:
        routes = [Route(path, self._endpoint, methods=["GET"]) for path in ENDPOINTS]
        routes += [
            Route("/_sim/stats", self._sim_stats, methods=["GET"]),
            Route("/_sim/videos", self._sim_add, methods=["POST"]),
            Route("/_sim/publish", self._sim_publish, methods=["POST"]),
            Route("/_sim/videos/{aid}", self._sim_get_video, methods=["GET"]),
            Route("/_sim/videos/{aid}/curve", self._sim_curve, methods=["POST"]),
            Route("/_sim/videos/{aid}/delete", self._sim_delete, methods=["POST"]),
            Route("/_sim/inject", self._sim_inject, methods=["POST"]),
            Route("/_sim/latency", self._sim_latency, methods=["POST"]),
            Route("/_sim/relay", self._relay, methods=["POST"]),
            Route("/_sim/relay/{name}", self._relay, methods=["POST"]),
        ]
        return Starlette(routes=routes, exception_handlers={HTTPError: handle_http_error})


class _BadRequest(Exception):
    pass


class _Gone(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def _int_param(query: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = query.get(name)
    if raw is None:
        if default is None:
            raise _BadRequest
        return default
    try:
        return int(raw)
    except ValueError:
        raise _BadRequest from None


_encode = msgspec.json.Encoder().encode


class _Relay(msgspec.Struct, forbid_unknown_fields=True):
    url: str


class _AddVideo(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    aid: int | None = None
    title: str | None = None
    description: str = ""
    tags: list[str] | None = None
    published_ms: int | None = None
    curve: Curve | None = None
    song: bool = True
    duration: int = 200


class _Publish(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    count: int = 1
    song_share: float = 0.5


class _Delete(msgspec.Struct, forbid_unknown_fields=True):
    code: int = -404


class _Inject(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    endpoint: str
    code: int | None = None
    http_status: int | None = None
    times: int = 1


class _Latency(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    min_ms: int
    max_ms: int


async def serve_sim(
    sim: BilibiliSim,
    bind: str,
    *,
    shutdown: trio.Event | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `sim` on `bind` until `shutdown` is set; started() gets the bound (host, port)."""
    await serve_fake(sim.app, bind, "sim.bilibili", shutdown=shutdown, task_status=task_status)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m daemon.fakes.bilibili", description="Serve a simulated Bilibili."
    )
    parser.add_argument("--bind", default="127.0.0.1:8702")
    parser.add_argument("--videos", type=int, default=300, help="videos published before start")
    parser.add_argument("--hours", type=float, default=48.0, help="spread of those videos")
    parser.add_argument("--publish-every", type=float, default=20.0, help="seconds; 0: never")
    parser.add_argument("--latency", default="0,0", help="min,max answer latency in ms")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--limits", choices=["default", "none"], default="default",
        help="default: 20/1 s, 130/15 s, 2000/5 min per client address; none: no -412",
    )  # fmt: skip
    parser.add_argument(
        "--bulk-limits", action="store_true", help="also 5/1 s, 40/15 s, 200/5 min on bulk"
    )
    parser.add_argument("--aids-out", help="write the aids of the initial videos to this file")
    args = parser.parse_args(argv)
    least, most = (int(x) for x in args.latency.split(","))

    sim = BilibiliSim(
        seed=args.seed,
        latency_ms=(least, most),
        limits=None if args.limits == "default" else [],
        bulk_limits=DEFAULT_BULK_LIMITS if args.bulk_limits else None,
    )
    now = wall_ms()
    aids = []
    for i in range(args.videos):
        age = int(args.hours * HOUR_MS * (args.videos - i) / max(args.videos, 1))
        aids.append(sim.add_video(published_ms=now - age, song=sim.rng.random() < 0.5))
    if args.aids_out:
        with open(args.aids_out, "w", encoding="utf-8") as out:
            out.write("\n".join(map(str, aids)))
    if args.publish_every > 0:
        sim.stream(int(args.publish_every * 1000))

    run_standalone(
        sim.app,
        args.bind,
        "sim.bilibili",
        lambda host, port: (
            f"Bilibili simulator on http://{host}:{port}\n"
            f"  {args.videos} videos over {args.hours} h, one more every "
            f"{args.publish_every} s; latency {least}-{most} ms\n"
            f"  try: curl 'http://{host}:{port}/x/web-interface/newlist?rid=30&ps=10&pn=1'\n"
            f'  controls: GET /_sim/stats, POST /_sim/publish {{"count": 5}}'
        ),
    )


if __name__ == "__main__":
    main()
