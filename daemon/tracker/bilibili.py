# The four Bilibili endpoints the tracker reads, as typed async calls.
#
# Parsing is separate from I/O: `parse_*` are pure functions from the raw answer bytes to typed
# values (tested with recorded-shape JSON), and `BiliClient` only builds URLs and hands them to
# the network delegate, which picks a proxy, enforces the limits and estimates the server time.
# msgspec decodes only the fields we read, so unknown or extra fields in Bilibili's large answers
# cost nothing and never break decoding. Every answer has the envelope {code, message, ttl, data};
# `code != 0` becomes `BiliError(code, message)`, so the caller decides what a code means for a
# video (-404/62002/62012: gone) or for the proxy (-412: rate limited, the video is fine).
#
# Tags: the reference's filter keeps only `old_channel` tags (an `indexOf` used as a boolean), and
# before that kept none. Its classifier was trained on `old_channel` + `topic` tags
# (ml/filter/db_utils.py), so those are the tags we keep: what the reference model expects as
# input. A tag without a `tag_type` (older answers) counts as `old_channel`. `bgm` and other
# types name background music or events, not the video, and are left out.
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import msgspec

from daemon.tracker.config import TaskKind

T = TypeVar("T")

KEPT_TAG_TYPES = frozenset({"old_channel", "topic", ""})
"""Tag types joined into a video's tags (see the module comment)."""

GONE_CODES = frozenset({-404, 62002, 62012})
"""Codes that mean the video is deleted or hidden (not a problem of the request)."""

RATE_LIMITED_CODE = -412

MAX_BULK = 50
"""Most aids in one bulk request (the reference's annual archive sends 50)."""


class Stat(msgspec.Struct, frozen=True):
    views: int
    danmakus: int
    replies: int
    likes: int
    coins: int
    shares: int
    favorites: int


class Uploader(msgspec.Struct, frozen=True):
    uid: int
    name: str
    sign: str
    fans: int
    face: str


class VideoDetail(msgspec.Struct, frozen=True):
    aid: int
    bvid: str
    title: str
    description: str
    tags: list[str]
    duration: int
    """Seconds."""
    published_ms: int
    cover_url: str
    uploader: Uploader
    stat: Stat


@dataclass(frozen=True, slots=True)
class Timed(Generic[T]):
    """A result with the delegate's estimate of the server's time when it answered."""

    value: T
    server_ms: int
    proxy: str
    """The name of the proxy that carried the request."""


class BiliError(Exception):
    """Bilibili answered with `code != 0` (-404, 62002, 62012, -412, ...)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"bilibili code {code}: {message}")
        self.code = code
        self.message = message

    @property
    def video_gone(self) -> bool:
        """The video is deleted or hidden (-404, 62002, 62012)."""
        return self.code in GONE_CODES

    @property
    def rate_limited(self) -> bool:
        """-412: the request was refused for its rate; the video itself is fine."""
        return self.code == RATE_LIMITED_CODE


class NoProxyAvailable(Exception):
    """Every proxy assigned to the task kind is rate-limited right now."""

    def __init__(self, task: TaskKind, retry_in_ms: int | None = None) -> None:
        super().__init__(f"no proxy available for {task}")
        self.task = task
        self.retry_in_ms = retry_in_ms
        """When the first of the kind's proxies will have room again (None: unknown)."""


class UpstreamError(Exception):
    """No usable answer: network failure, a non-200 HTTP status, a relay failure, or a body that
    is not the documented shape. Never a Bilibili code (that is `BiliError`)."""

    def __init__(
        self, message: str, *, status: int | None = None, body: bytes = b"", proxy: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body[:4096]
        self.proxy = proxy


class Fetcher(Protocol):
    """What the client needs from the network delegate."""

    async def request(self, url: str, task: TaskKind) -> Timed[bytes]: ...

    def penalize(self, proxy: str) -> None:
        """Bilibili refused a request through `proxy` for its rate (-412)."""


# ---- wire shapes (only the fields we read) ----------------------------------------------------


class _Envelope(msgspec.Struct):
    code: int
    message: str = ""


class _Archive(msgspec.Struct):
    aid: int


class _NewlistData(msgspec.Struct):
    archives: list[_Archive] | None = None


class _NewlistAnswer(msgspec.Struct):
    data: _NewlistData | None = None


class _ViewStat(msgspec.Struct):
    view: int
    danmaku: int
    reply: int
    like: int
    coin: int
    share: int
    favorite: int

    def to_stat(self) -> Stat:
        return Stat(
            views=self.view,
            danmakus=self.danmaku,
            replies=self.reply,
            likes=self.like,
            coins=self.coin,
            shares=self.share,
            favorites=self.favorite,
        )


class _ViewData(msgspec.Struct):
    stat: _ViewStat


class _ViewAnswer(msgspec.Struct):
    data: _ViewData


class _Owner(msgspec.Struct):
    mid: int
    name: str = ""
    face: str = ""


class _View(msgspec.Struct):
    aid: int
    bvid: str
    title: str
    owner: _Owner
    stat: _ViewStat
    pubdate: int
    desc: str = ""
    duration: int = 0
    pic: str = ""


class _CardInner(msgspec.Struct):
    sign: str = ""
    name: str = ""
    face: str = ""


class _Card(msgspec.Struct):
    card: _CardInner = msgspec.field(default_factory=_CardInner)
    follower: int = 0


class _Tag(msgspec.Struct):
    tag_name: str
    tag_type: str = ""


class _DetailData(msgspec.Struct, rename={"view": "View", "card": "Card", "tags": "Tags"}):
    view: _View
    card: _Card = msgspec.field(default_factory=_Card)
    tags: list[_Tag] | None = None


class _DetailAnswer(msgspec.Struct):
    data: _DetailData


class _CntInfo(msgspec.Struct):
    play: int
    danmaku: int = 0
    reply: int = 0
    thumb_up: int = 0
    coin: int = 0
    share: int = 0
    collect: int = 0

    def to_stat(self) -> Stat:
        return Stat(
            views=self.play,
            danmakus=self.danmaku,
            replies=self.reply,
            likes=self.thumb_up,
            coins=self.coin,
            shares=self.share,
            favorites=self.collect,
        )


class _Resource(msgspec.Struct):
    id: int
    cnt_info: _CntInfo


class _BulkAnswer(msgspec.Struct):
    data: list[_Resource] | None = None


_envelope = msgspec.json.Decoder(_Envelope)
_newlist = msgspec.json.Decoder(_NewlistAnswer)
_view = msgspec.json.Decoder(_ViewAnswer)
_detail = msgspec.json.Decoder(_DetailAnswer)
_bulk = msgspec.json.Decoder(_BulkAnswer)


# ---- pure parsing -----------------------------------------------------------------------------


def envelope_code(body: bytes) -> tuple[int, str] | None:
    """(code, message) of a body with Bilibili's envelope, None if it has none."""
    try:
        envelope = _envelope.decode(body)
    except msgspec.DecodeError:
        return None
    return envelope.code, envelope.message


def _checked(body: bytes, decoder: msgspec.json.Decoder[T], what: str) -> T:
    found = envelope_code(body)
    if found is None:
        raise UpstreamError(f"{what}: the answer is not a Bilibili envelope", body=body)
    code, message = found
    if code != 0:
        raise BiliError(code, message)
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise UpstreamError(f"{what}: unexpected answer shape: {exc}", body=body) from None


def parse_newlist(body: bytes) -> list[int]:
    """The aids of one newlist page, in answer order (newest first); [] for an empty page."""
    answer = _checked(body, _newlist, "newlist")
    if answer.data is None or answer.data.archives is None:
        return []
    return [archive.aid for archive in answer.data.archives]


def parse_view_stat(body: bytes) -> Stat:
    """`data.stat` of `/x/web-interface/view`."""
    return _checked(body, _view, "view").data.stat.to_stat()


def kept_tags(tags: Sequence[tuple[str, str]]) -> list[str]:
    """Names of the (name, type) tags we keep, in answer order, without blanks or repeats."""
    seen: list[str] = []
    for name, tag_type in tags:
        name = name.strip()
        if tag_type in KEPT_TAG_TYPES and name and name not in seen:
            seen.append(name)
    return seen


def parse_view_detail(body: bytes) -> VideoDetail:
    """Metadata, uploader and stat from `/x/web-interface/view/detail`."""
    data = _checked(body, _detail, "view/detail").data
    view = data.view
    owner = view.owner
    return VideoDetail(
        aid=view.aid,
        bvid=view.bvid,
        title=view.title,
        description=view.desc,
        tags=kept_tags([(t.tag_name, t.tag_type) for t in data.tags or []]),
        duration=view.duration,
        published_ms=view.pubdate * 1000,
        cover_url=view.pic,
        uploader=Uploader(
            uid=owner.mid,
            name=owner.name or data.card.card.name,
            sign=data.card.card.sign,
            fans=data.card.follower,
            face=owner.face or data.card.card.face,
        ),
        stat=view.stat.to_stat(),
    )


def parse_bulk(body: bytes) -> dict[int, Stat]:
    """Stats by aid from the medialist resource infos answer; missing videos are absent."""
    answer = _checked(body, _bulk, "resource/infos")
    return {item.id: item.cnt_info.to_stat() for item in answer.data or []}


def bulk_resources(aids: Sequence[int]) -> str:
    """The `resources` parameter: `<aid>:2,` per video (2 = video), trailing comma included."""
    if not 1 <= len(aids) <= MAX_BULK:
        raise ValueError(f"a bulk request takes 1 to {MAX_BULK} aids, got {len(aids)}")
    return "".join(f"{int(aid)}:2," for aid in aids)


# ---- the client -------------------------------------------------------------------------------


class BiliClient:
    """The four endpoints through a delegate; each call names its task kind for the proxies."""

    def __init__(self, delegate: Fetcher, base_url: str = "https://api.bilibili.com") -> None:
        self.delegate = delegate
        self.base_url = base_url.rstrip("/")

    async def _get(self, path: str, task: TaskKind) -> Timed[bytes]:
        try:
            return await self.delegate.request(f"{self.base_url}{path}", task)
        except UpstreamError as exc:
            # Bilibili answers some refusals (-412) with an HTTP error status and its envelope.
            found = envelope_code(exc.body) if exc.body else None
            if found is not None and found[0] != 0:
                raise BiliError(*found) from exc
            raise

    async def _call(self, path: str, task: TaskKind, parse: Callable[[bytes], T]) -> Timed[T]:
        got = await self._get(path, task)
        try:
            value = parse(got.value)
        except BiliError as exc:
            if exc.rate_limited:  # -412 in an HTTP 200 answer: the proxy went too fast
                self.delegate.penalize(got.proxy)
            raise
        return Timed(value, got.server_ms, got.proxy)

    async def newlist(self, pn: int, ps: int, rid: int = 30) -> Timed[list[int]]:
        """Aids of page `pn` (1-based, `ps` per page) of the zone's newest videos."""
        path = f"/x/web-interface/newlist?rid={rid}&ps={ps}&pn={pn}"
        return await self._call(path, "discovery", parse_newlist)

    async def view_detail(self, aid: int) -> Timed[VideoDetail]:
        path = f"/x/web-interface/view/detail?aid={int(aid)}"
        return await self._call(path, "ingest", parse_view_detail)

    async def view_stat(self, aid: int) -> Timed[Stat]:
        return await self._call(
            f"/x/web-interface/view?aid={int(aid)}", "snapshot", parse_view_stat
        )

    async def bulk_stats(self, aids: Sequence[int]) -> Timed[dict[int, Stat]]:
        """Stats of up to 50 videos in one request; videos missing from the answer are absent."""
        path = f"/medialist/gateway/base/resource/infos?resources={bulk_resources(aids)}"
        got = await self._call(path, "bulk", parse_bulk)
        wanted = set(aids)
        stats = {aid: stat for aid, stat in got.value.items() if aid in wanted}
        return Timed(stats, got.server_ms, got.proxy)
