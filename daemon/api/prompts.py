# POST /v2/crawl/params-preview over HTTP (firecrawl-py `crawl_params_preview`): the options a
# prompt would give a crawl of `url`, without starting it. Bad input is Firecrawl's 400 before the
# model is asked; without `[llm]` a 501 naming it; a model that fails Firecrawl's 400 or a 502
# (daemon/crawl/prompts/service.py). A crawl's own `prompt` is read in daemon/api/crawl.py.
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from daemon.api.app import ApiRoute, json
from daemon.api.crawl import bad_request, firecrawl_error, request_body
from daemon.crawl.problems import BadRequest
from daemon.crawl.prompts.models import (
    ParamsPreviewData,
    ParamsPreviewRequest,
    ParamsPreviewResponse,
    parse_params_preview,
)
from daemon.crawl.prompts.rules import warning_of
from daemon.crawl.prompts.service import PROMPT_ERRORS, CrawlPrompts, PromptError


def routes(prompts: CrawlPrompts) -> list[ApiRoute]:
    async def params_preview(request: Request) -> Response:
        try:
            parsed = parse_params_preview(await request_body(request))
        except BadRequest as exc:
            return bad_request(exc)
        try:
            generated = await prompts.generate(parsed.url, parsed.prompt)
        except PromptError as exc:
            return firecrawl_error(exc.status, exc.message, exc.code)
        data = ParamsPreviewData(url=parsed.url, **generated.options)
        warning = warning_of(generated.dropped, [])
        return json(ParamsPreviewResponse(success=True, data=data, warning=warning or None))

    return [
        ApiRoute("POST", "/v2/crawl/params-preview", params_preview,
                 "The crawl options a prompt gives a crawl of `url` (the site mapped, one"
                 " structured call of [llm], the answer checked by the crawl rules); nothing is"
                 " crawled", body=ParamsPreviewRequest, response=ParamsPreviewResponse,
                 errors={400: "Bad Request (the field named)", **PROMPT_ERRORS},
                 body_required=True),
    ]  # fmt: skip
