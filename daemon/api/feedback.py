# firecrawl-mcp's feedback tools over HTTP. Their answers are checked by the MCP against an output
# schema that refuses unknown keys, so a stored feedback answers only keys it lists (`success`,
# `feedbackId`, `message`, `alreadySubmitted`, `creditsRefunded`); a bad body is Firecrawl's 400
# naming the fields and stores nothing. GET /v2/feedback is crawld's own: what was stored, newest
# first, for operators and the console. The work: daemon/crawl/feedback/.
from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response

from daemon.api import jobs as jobs_api
from daemon.api.app import ApiRoute, int_param, json
from daemon.api.crawl import bad_request, request_body
from daemon.crawl.feedback import rules
from daemon.crawl.feedback.service import FeedbackService
from daemon.crawl.problems import BadRequest, json_object

LIMIT = int_param("limit", "Most items in this answer", 1, 1000)
OFFSET = int_param("offset", "Items to skip", 0, 2**31)


Text200 = Annotated[str, Meta(max_length=200)]
Text1000 = Annotated[str, Meta(max_length=1000)]
Text2000 = Annotated[str, Meta(max_length=2000)]
Text4000 = Annotated[str, Meta(max_length=4000)]
Codes = Annotated[
    list[Annotated[str, Meta(extra_json_schema={"pattern": rules.CODE_PATTERN})]],
    Meta(max_length=20),
]
Url = Annotated[str, Meta(max_length=rules.MAX_URL, extra_json_schema={
    "pattern": rules.URL_PATTERN})]  # fmt: skip
Rating = Literal["good", "bad", "partial"]


class ValuableSource(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    url: Url
    reason: Text1000 | None = None


class MissingContent(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    topic: Annotated[str, Meta(min_length=1, max_length=200)]
    description: Text2000 | None = None


class SearchFeedbackBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /v2/search/{searchId}/feedback, as firecrawl_search_feedback sends it (checked by
    daemon/crawl/feedback/rules.py, declared here)."""

    rating: Rating
    valuableSources: Annotated[list[ValuableSource], Meta(max_length=50)] | None = None
    missingContent: Annotated[list[MissingContent], Meta(max_length=20)] | None = None
    querySuggestions: Text2000 | None = None
    origin: Text200 | None = None


class FeedbackFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /v2/feedback, as firecrawl_feedback sends it (checked by
    daemon/crawl/feedback/rules.py, declared here)."""

    endpoint: Literal["search", "scrape", "parse", "map", "alexandria"]
    rating: Rating
    jobId: Any = None
    """a UUID; required unless endpoint is alexandria (then not read)"""
    issues: Codes | None = None
    tags: Codes | None = None
    note: Text4000 | None = None
    valuableSources: Annotated[list[ValuableSource], Meta(max_length=50)] | None = None
    missingContent: Annotated[list[MissingContent], Meta(max_length=50)] | None = None
    querySuggestions: Text2000 | None = None
    url: Url | None = None
    pageNumbers: Annotated[list[Annotated[int, Meta(ge=1)]], Meta(max_length=100)] | None = None
    metadata: dict[str, Any] | None = None
    requestedWebsite: dict[str, Any] | None = None
    rationale: Text2000 | None = None
    providerFeedback: Annotated[list[dict[str, Any]], Meta(max_length=20)] | None = None
    capabilityFeedback: Annotated[list[dict[str, Any]], Meta(max_length=20)] | None = None
    origin: Text200 | None = None


FeedbackBody = Annotated[FeedbackFields, Meta(extra_json_schema={
    "if": {"not": {"required": ["endpoint"], "properties": {"endpoint": {"const": "alexandria"}}}},
    "then": {"required": ["jobId"],
             "properties": {"jobId": {"type": "string", "pattern": rules.UUID_PATTERN}}},
    "description": "jobId (a UUID) unless endpoint is alexandria",
})]  # fmt: skip


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
