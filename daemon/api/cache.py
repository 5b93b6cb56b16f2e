# The document cache's admin route (docs/how-to/cache.md): DELETE /v2/cache with a URL prefix drops
# every cached copy of the URLs it starts, on every instance (the cache is in the store). It sits
# behind the API key as every route does; its body is strict JSON like the crawl API's.
from __future__ import annotations

from typing import Annotated

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon.api.app import ApiRoute, json
from daemon.api.crawl import bad_request, firecrawl_error, request_body
from daemon.crawl.cache.documents import DocumentCache
from daemon.crawl.options import models
from daemon.crawl.problems import BadRequest

MAX_PREFIX = models.MAX_URL_LENGTH


class CacheDelete(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    urlPrefix: Annotated[str, msgspec.Meta(pattern="^http", max_length=MAX_PREFIX)]
    """Cached documents whose URL (without #fragment) starts with this go, e.g.
    "https://example.com/docs/"; at least "http" so no request drops all by accident."""


class CacheDeleted(msgspec.Struct, kw_only=True):
    success: bool
    deleted: int


def routes(cache: DocumentCache) -> list[ApiRoute]:
    async def delete(request: Request) -> Response:
        try:
            raw = await request_body(request)
            try:
                body = msgspec.json.decode(raw or b"null", type=CacheDelete)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                message, _, where = str(exc).rpartition(" - at `")
                path = where[:-1] if message and where.endswith("`") else "$"
                raise BadRequest.at(path, message or str(exc)) from None
            prefix = body.urlPrefix
            if not prefix.startswith("http") or len(prefix) > MAX_PREFIX:
                raise BadRequest.at(
                    "$.urlPrefix",
                    f"a URL prefix starting with http (at most {MAX_PREFIX} characters)",
                )
        except BadRequest as exc:
            return bad_request(exc)
        if cache.store is None:
            return firecrawl_error(503, "the document cache has no store")
        return json(CacheDeleted(success=True, deleted=await cache.delete(prefix)))

    return [
        ApiRoute("DELETE", "/v2/cache", delete,
                 "Delete the cached documents whose URL starts with urlPrefix (every instance)",
                 body=CacheDelete, body_required=True, response=CacheDeleted,
                 errors={400: "Bad Request: urlPrefix missing or not a URL prefix"}),
    ]  # fmt: skip
