# firecrawl-mcp's feedback tools over HTTP. Their answers are checked by the MCP against an output
# schema that refuses unknown keys, so a stored feedback answers only keys it lists (`success`,
# `feedbackId`, `message`, `alreadySubmitted`, `creditsRefunded`); a bad body is Firecrawl's 400
# naming the fields and stores nothing. GET /v2/feedback is crawld's own: what was stored, newest
# first, for operators and the console. The work: daemon/crawl/feedback/.
from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon.api import jobs as jobs_api
from daemon.api.app import ApiRoute, int_param, json
from daemon.api.crawl import bad_request, request_body
from daemon.crawl.feedback.service import FeedbackService
from daemon.crawl.problems import BadRequest, json_object

LIMIT = int_param("limit", "Most items in this answer", 1, 1000)
OFFSET = int_param("offset", "Items to skip", 0, 2**31)


class ValuableSource(msgspec.Struct, kw_only=True):
    url: str
    reason: str | None = None


class MissingContent(msgspec.Struct, kw_only=True):
    topic: str
    description: str | None = None


class SearchFeedbackBody(msgspec.Struct, kw_only=True):
    """POST /v2/search/{searchId}/feedback, as firecrawl_search_feedback sends it."""

    rating: str
    """good, bad or partial"""
    valuableSources: list[ValuableSource] | None = None
    missingContent: list[MissingContent] | None = None
    querySuggestions: str | None = None
    origin: str | None = None


class FeedbackBody(msgspec.Struct, kw_only=True):
    """POST /v2/feedback, as firecrawl_feedback sends it."""

    endpoint: str
    """search, scrape, parse, map or alexandria"""
    rating: str
    jobId: str | None = None
    """a UUID; required unless endpoint is alexandria"""
    issues: list[str] | None = None
    tags: list[str] | None = None
    note: str | None = None
    valuableSources: list[ValuableSource] | None = None
    missingContent: list[MissingContent] | None = None
    querySuggestions: str | None = None
    url: str | None = None
    pageNumbers: list[int] | None = None
    metadata: dict[str, Any] | None = None
    requestedWebsite: dict[str, Any] | None = None
    rationale: str | None = None
    providerFeedback: list[dict[str, Any]] | None = None
    capabilityFeedback: list[dict[str, Any]] | None = None
    origin: str | None = None


class FeedbackAnswer(msgspec.Struct, kw_only=True):
    success: bool
    feedbackId: str
    message: str
    alreadySubmitted: bool
    creditsRefunded: int = 0


class FeedbackItem(msgspec.Struct, kw_only=True):
    id: str
    endpoint: str
    targetId: str | None
    rating: str
    createdAt: str
    body: dict[str, Any]


class FeedbackList(msgspec.Struct, kw_only=True):
    success: bool
    data: list[FeedbackItem]
    total: int


def _answer(feedback_id: str, before: bool) -> Response:
    said = "Feedback recorded" + (" (this target already had feedback)" if before else "")
    return json(FeedbackAnswer(success=True, feedbackId=feedback_id, message=said,
                               alreadySubmitted=before))  # fmt: skip


def routes(service: FeedbackService) -> list[ApiRoute]:
    async def search_feedback(request: Request) -> Response:
        try:
            raw = json_object(await request_body(request))
            return _answer(*await service.record_search(request.path_params["searchId"], raw))
        except BadRequest as exc:
            return bad_request(exc)

    async def job_feedback(request: Request) -> Response:
        try:
            return _answer(*await service.record_job(json_object(await request_body(request))))
        except BadRequest as exc:
            return bad_request(exc)

    async def listing(request: Request) -> Response:
        limit, offset = LIMIT.read_int(request, 50), OFFSET.read_int(request, 0)
        items, total = await service.listing(limit, offset)
        data = [FeedbackItem(id=i["id"], endpoint=i["endpoint"], targetId=i["targetId"],
                             rating=i["rating"], createdAt=jobs_api.iso(i["createdMs"]),
                             body=i["body"]) for i in items]  # fmt: skip
        return json(FeedbackList(success=True, data=data, total=total))

    bad = {400: "Bad Request: unknown keys or invalid values, each named in `details`;"
                " nothing is stored"}  # fmt: skip
    return [
        ApiRoute("POST", "/v2/search/{searchId}/feedback", search_feedback,
                 "Feedback on a search answer (its `id`); crawld keeps no record of searches,"
                 " so any UUID is accepted; `alreadySubmitted` when that search had feedback",
                 body=SearchFeedbackBody, response=FeedbackAnswer, errors=bad,
                 path_params={"searchId": {"type": "string", "format": "uuid"}},
                 body_required=True),
        ApiRoute("POST", "/v2/feedback", job_feedback,
                 "Feedback on a search, scrape, parse or map job (jobId), or alexandria",
                 body=FeedbackBody, response=FeedbackAnswer, errors=bad, body_required=True),
        ApiRoute("GET", "/v2/feedback", listing,
                 "crawld's own: the stored feedback, newest first, and how many there are",
                 response=FeedbackList, query=[LIMIT, OFFSET]),
    ]  # fmt: skip
