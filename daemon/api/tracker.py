# The tracker's HTTP routes (specs/tracker.md, Interface): a video's state, its snapshot series
# (JSON or CSV, paginated by time with a `next` link), tracking a video by hand, the songs closest
# to a milestone, and the schedule overview. Reads go through the tracker's queries
# (daemon/tracker/queries.py, the store's reader connections); the only write
# (POST /tracker/videos) goes through the same ingest queue as discovery.
from __future__ import annotations

import csv
import io
from typing import Annotated, Any
from urllib.parse import urlencode

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon.api.app import ApiRoute, QueryParam, int_param, json
from daemon.api.errors import HTTPError, read_json_body
from daemon.process import Daemon
from daemon.tracker.engine import AlreadyTracked
from daemon.tracker.queries import MAX_AID, parse_aid
from daemon.tracker.service import TrackerService

SNAPSHOT_FIELDS = ("at_ms", "views", "danmakus", "replies", "likes", "coins", "shares",
                   "favorites")  # fmt: skip
MAX_MS = 2**53
SINCE = int_param("since", "epoch ms, inclusive (default 0)", 0, MAX_MS)
UNTIL = int_param("until", "epoch ms, inclusive (default: no end)", 0, MAX_MS)
SNAPSHOT_LIMIT = int_param("limit", "rows per page (default 1000)", 1, 10_000)
FORMAT = QueryParam("format", "json (default) or csv", enum=("json", "csv"))
MILESTONE_LIMIT = int_param("limit", "songs (default 50)", 1, 1000)


class TrackRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    aid: Annotated[int, msgspec.Meta(ge=1, le=MAX_AID)]
    """The video's av number."""


class TrackResponse(msgspec.Struct):
    aid: int
    queued: list[str]
    """What happens next: ingest (metadata, uploader, first snapshot), classify, and for a song
    its four `new` snapshots."""
    tracker_enabled: bool


class VideoResponse(msgspec.Struct):
    aid: int
    status: int | str
    """"ok", "queued" (waiting for ingest) or the upstream error code that took it away."""
    bvid: str | None = None
    title: str | None = None
    description: str | None = None
    tags: list[str] = []
    duration: int | None = None
    published_ms: int | None = None
    cover_url: str | None = None
    added_ms: int | None = None
    uploader: dict[str, Any] | None = None
    song: bool = False
    label: dict[str, Any] | None = None
    latest_snapshot: dict[str, Any] | None = None
    schedules: list[dict[str, Any]] = []
    milestone: dict[str, Any] | None = None
    ingest: dict[str, Any] | None = None


class SnapshotsResponse(msgspec.Struct):
    aid: int
    count: int
    snapshots: list[dict[str, int]]
    next: str | None
    """The URL of the next page (None on the last one)."""


class MilestonesResponse(msgspec.Struct):
    count: int
    songs: list[dict[str, Any]]


class SchedulesResponse(msgspec.Struct):
    counts: dict[str, dict[str, int]]
    windows: list[dict[str, int]]
    window_ms: int
    lag: dict[str, dict[str, Any]]


def snapshots_csv(rows: list[tuple[int, ...]]) -> str:
    """Snapshot rows as CSV with a header line (the download the console links to)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(SNAPSHOT_FIELDS)
    writer.writerows(rows)
    return out.getvalue()


def path_aid(request: Request) -> int:
    """The `{aid}` path parameter (NNN or avNNN), or a 400 naming it (the console's routes
    take it the same way)."""
    raw = request.path_params["aid"]
    aid = parse_aid(raw)
    if aid is None:
        raise HTTPError(400, "aid must be a positive integer (or avNNN)", {"aid": raw[:40]})
    return aid


class TrackerHandlers:
    """The /tracker routes' handlers over the tracker's service."""

    def __init__(self, service: TrackerService) -> None:
        self.service = service
        self.queries = service.queries

    async def video(self, request: Request) -> Response:
        aid = path_aid(request)
        info = await self.queries.video(aid)
        if info is None:
            raise HTTPError(404, f"video {aid} is not tracked", {"aid": aid})
        return json(msgspec.convert(info, VideoResponse))

    async def snapshots(self, request: Request) -> Response:
        aid = path_aid(request)
        since = SINCE.read_int(request, 0)
        until = UNTIL.read_int(request, MAX_MS)
        limit = SNAPSHOT_LIMIT.read_int(request, 1000)
        fmt = request.query_params.get("format", "json")
        if fmt not in FORMAT.enum:  # type: ignore[operator]
            raise HTTPError(400, "format must be json or csv", {"format": fmt[:20]})
        rows = await self.queries.snapshots(aid, since, until, limit + 1)
        if rows is None:
            raise HTTPError(404, f"video {aid} is not tracked", {"aid": aid})
        next_url = None
        if len(rows) > limit:
            rows = rows[:limit]
            query = {"since": rows[-1][0] + 1, "limit": limit, "format": fmt}
            if "until" in request.query_params:
                query["until"] = until
            next_url = f"{request.url.path}?{urlencode(query)}"
        if fmt == "csv":
            headers = {"Link": f'<{next_url}>; rel="next"'} if next_url else {}
            return Response(snapshots_csv(rows), media_type="text/csv", headers=headers)
        items = [dict(zip(SNAPSHOT_FIELDS, r, strict=True)) for r in rows]
        return json(SnapshotsResponse(aid, len(items), items, next_url))

    async def track(self, request: Request) -> Response:
        body = await read_json_body(request, TrackRequest, empty_ok=False)
        try:
            await self.service.tracker.track(body.aid)
        except AlreadyTracked:
            raise HTTPError(
                409, f"video {body.aid} is already tracked", {"aid": body.aid}
            ) from None
        queued = ["ingest", "classify", "new schedules if it is a song"]
        return json(TrackResponse(body.aid, queued, self.service.gate.open), status=202)

    async def milestones(self, request: Request) -> Response:
        limit = MILESTONE_LIMIT.read_int(request, 50)
        songs = await self.queries.closest_to_milestone(limit)
        return json(MilestonesResponse(len(songs), songs))

    async def schedules(self, request: Request) -> Response:
        overview = await self.service.tracker.schedules_overview()
        return json(msgspec.convert(overview, SchedulesResponse))


def routes(daemon: Daemon, service: TrackerService) -> list[ApiRoute]:
    h = TrackerHandlers(service)
    bad_aid = {400: "aid is not a positive integer", 404: "video not tracked"}
    aids = {"aid": {"type": "integer", "minimum": 1, "maximum": MAX_AID}}  # avNNN is taken too
    return [
        ApiRoute("GET", "/tracker/videos/{aid}", h.video,
                 "A tracked video: metadata, uploader, label, status, latest snapshot, pending"
                 " schedules, milestone target and ETA", response=VideoResponse, errors=bad_aid,
                 path_params=aids),
        ApiRoute("GET", "/tracker/videos/{aid}/snapshots", h.snapshots,
                 "A video's snapshots, oldest first, paginated by `next`",
                 response=SnapshotsResponse,
                 query=[SINCE, UNTIL, SNAPSHOT_LIMIT, FORMAT], path_params=aids,
                 errors={**bad_aid, 400: "bad aid, since, until, limit or format"}),
        ApiRoute("POST", "/tracker/videos", h.track,
                 "Track a video now: ingest, classify and (for a song) its new schedules",
                 body=TrackRequest, response=TrackResponse, ok_status=202, body_required=True,
                 errors={400: "invalid JSON", 422: "invalid field", 409: "already tracked"}),
        ApiRoute("GET", "/tracker/milestones", h.milestones,
                 "Songs closest to their next milestone: views, target, ETA hours, next check",
                 response=MilestonesResponse,
                 query=[MILESTONE_LIMIT],
                 errors={400: "bad limit"}),
        ApiRoute("GET", "/tracker/schedules", h.schedules,
                 "Schedules by type × status, the fill of the next windows, lag per type",
                 response=SchedulesResponse),
    ]  # fmt: skip
