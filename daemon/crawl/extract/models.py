# Request and response shapes of Firecrawl v2's /extract, as firecrawl-py 4.55 and firecrawl-js
# 4.42 send and read them. Validation follows the crawl API's (daemon/crawl/options/models.py): the
# body is read as a JSON object, every problem is collected and reported in one 400 naming its
# field, and what crawld cannot do is refused by name (web search without [search], agents), never
# silently dropped.
# The validated request becomes an ExtractPlan stored with the job, so a restarted daemon works
# on exactly what was accepted.
from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from daemon.config import WebhookSpec, WebhookURL
from daemon.crawl.options.llm_formats import LlmCheck
from daemon.crawl.options.models import (
    ScrapeOptions,
    check_scrape_options,
    client_field_problems,
    url_problems,
    webhook_of,
)
from daemon.crawl.options.schemas import (
    HTTP_URL,
    INTEGRATION,
    JSON_SCHEMA,
    MAX_SAFE_INTEGER,
    UNSUPPORTED,
    body_model,
    borrowed,
)
from daemon.crawl.problems import (
    BadRequest,
    Problem,
    converted,
    json_object,
    problem,
    unknown_keys,
)
from daemon.crawl.v1 import models as v1_models
from daemon.crawl.v1 import translate as v1
from daemon.jsonvalues import deployment_schema
from daemon.llm import rules as llm_rules

MAX_URLS = 10
"""Firecrawl's beta limit on `urls`, with its words."""
TOO_MANY_URLS = "Maximum of 10 URLs allowed per request while in beta."
NEED_URLS_OR_PROMPT = "Either 'urls' or 'prompt' must be provided."
MAX_PROMPT = 10_000
DEFAULT_LIMIT = 100
"""Most pages one extract job reads when a `/*` URL is expanded and `limit` is absent: each page
is one model call, so the default stays small (Firecrawl's map default is far larger)."""
MAX_LIMIT = 10_000


class ExtractScrapeOptions(ScrapeOptions, kw_only=True, forbid_unknown_fields=True):
    """An extract's `scrapeOptions`: each page is read as markdown whatever `formats` says (a
    warning tells so)."""

    formats: list[str | dict[str, Any]] = msgspec.field(default_factory=lambda: ["markdown"])


Prompt = Annotated[str, Meta(max_length=MAX_PROMPT)]
JobTimeout = Annotated[int, Meta(ge=1000, le=MAX_SAFE_INTEGER, description="milliseconds")]


class ExtractRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    urls: Annotated[list[str], Meta(extra_json_schema={"maxItems": MAX_URLS})] | None = None
    prompt: Prompt | None = None
    systemPrompt: Prompt | None = None
    schema: Annotated[dict[str, Any], Meta(extra_json_schema=JSON_SCHEMA)] | None = None
    limit: Annotated[int, Meta(ge=1, le=MAX_LIMIT)] | None = None
    ignoreSitemap: bool = False
    includeSubdomains: bool = True
    allowExternalLinks: bool = False
    enableWebSearch: bool = False
    scrapeOptions: ExtractScrapeOptions | None = None
    origin: str | None = None
    integration: Annotated[str, Meta(extra_json_schema=INTEGRATION)] | None = None
    urlTrace: bool = False
    timeout: JobTimeout | None = None
    """Milliseconds for the whole job, from its creation; a job past it fails."""
    agent: Annotated[dict[str, Any] | None, UNSUPPORTED] = None
    showSources: bool = False
    ignoreInvalidURLs: bool = True
    webhook: WebhookURL | WebhookSpec | None = None
    threatProtection: Annotated[dict[str, Any] | None, UNSUPPORTED] = None
    provider: Annotated[str, Meta(extra_json_schema=deployment_schema("LlmProvider"))] | None = None
    """crawld's own: a named `[llm.providers]` entry instead of the default model."""
    # Firecrawl's older names, taken and dropped (showSources for the first).
    experimental_showSources: Any = msgspec.field(default=None, name="__experimental_showSources")
    experimental_streamSteps: Any = msgspec.field(default=None, name="__experimental_streamSteps")
    experimental_llmUsage: Any = msgspec.field(default=None, name="__experimental_llmUsage")
    experimental_showCostTracking: Any = msgspec.field(
        default=None, name="__experimental_showCostTracking")  # fmt: skip
    experimental_cacheKey: Any = msgspec.field(default=None, name="__experimental_cacheKey")
    experimental_cacheMode: Any = msgspec.field(default=None, name="__experimental_cacheMode")


ExtractBody = Annotated[ExtractRequest, Meta(extra_json_schema=deployment_schema("ExtractRules"))]
"""An extract body with the rules between its fields (urls or a prompt, web search), which
depend on whether this deployment has a search provider."""
_EXPERIMENTAL = frozenset(
    f.encode_name
    for f in msgspec.structs.fields(ExtractRequest)
    if f.name.startswith("experimental_")
)
_KEYS = frozenset(f.encode_name for f in msgspec.structs.fields(ExtractRequest))


V1ExtractBody = body_model(
    "V1ExtractBody", "The body of POST /v1/extract: v1's scrapeOptions (onlyMainContent false by"
    " default), ignoreInvalidURLs false by default.",
    borrowed(ExtractRequest, set(ExtractRequest.__struct_fields__) - {"scrapeOptions"},
                       ignoreInvalidURLs=(bool, False),
                       scrapeOptions=(v1_models.with_rules(v1_models.V1ScrapeOptions | None),
                                      None)),
    rename={f.name: f.encode_name for f in msgspec.structs.fields(ExtractRequest)
            if f.name != f.encode_name},
)  # fmt: skip

V1ExtractBodyRules = v1_models.marked(V1ExtractBody, "V1ExtractRules")


def extract_rules(*, search: bool, v1: bool = False) -> dict[str, Any]:
    """`ExtractRules` (`V1ExtractRules` with `v1`): the rules between an extract body's fields,
    with or without [search]."""
    no_urls = {"anyOf": [{"not": {"required": ["urls"]}},
                         {"properties": {"urls": {"type": ["null"]}}},
                         {"properties": {"urls": {"maxItems": 0}}}]}  # fmt: skip
    prompt = {"required": ["prompt"],
              "properties": {"prompt": {"type": "string", "minLength": 1}}}  # fmt: skip
    web_search = {
        "required": ["enableWebSearch"],
        "properties": {"enableWebSearch": {"const": True}},
    }
    given = {"required": ["ignoreInvalidURLs"], "properties": {"ignoreInvalidURLs": {"const": v1}}}
    rules: list[dict[str, Any]] = [  # every URL valid unless invalid ones are ignored
        {"if": {"not": given} if v1 else given,
         "then": {"properties": {"urls": {"anyOf": [{"type": "null"},
                                                     {"items": {"type": "string", **HTTP_URL}}]}}}},
        {"if": {"not": web_search},
         "then": {"properties": {"urls": {"anyOf": [
             {"type": "null"}, {"maxItems": 0}, {"contains": {"type": "string", **HTTP_URL}}]}}}},
    ]  # fmt: skip
    if search:
        rules += [{"if": {"anyOf": [no_urls, web_search]}, "then": prompt}]
    else:
        rules += [{"not": no_urls}, {"not": web_search}]
    return {("V1ExtractRules" if v1 else "ExtractRules"): {"allOf": rules, "description": (
        "urls, or a prompt to search the web for (with a search provider); with"
        " enableWebSearch a prompt; without ignoreInvalidURLs every URL valid, else one at"
        " least")}}  # fmt: skip


class ExtractPlan(msgspec.Struct, kw_only=True):
    """A validated extract request with every default applied; stored with the job."""

    urls: list[str]
    """In the request's order; a `/*` URL keeps its suffix (the job expands it)."""
    prompt: str | None
    system_prompt: str | None
    schema: dict[str, Any] | None
    limit: int
    ignore_sitemap: bool
    include_subdomains: bool
    allow_external_links: bool
    options: ScrapeOptions
    web_search: bool = False
    """Add the pages a web search for the prompt finds (enableWebSearch, or no urls)."""
    show_sources: bool
    timeout: int | None
    webhook: WebhookSpec | None
    provider: str | None = None
    invalid_urls: list[str] = []
    warning: str = ""


def wildcard_base(url: str) -> str | None:
    """`https://site/docs/*` → `https://site/docs/`; None for a URL without the `/*` suffix."""
    return url[:-1] if url.endswith("/*") else None


def schema_problems(schema: Any, path: str = "$.schema") -> list[dict[str, Any]]:
    """Firecrawl's 400s for an extraction schema (the LLM service's checks, shared with the
    `json` format): a JSON Schema object that compiles, with no schema-less dictionary."""
    found = llm_rules.schema_problem(schema)
    return [] if found is None else [problem(path, found)]


def parse_extract(
    body: bytes,
    *,
    browser: bool = False,
    search: bool = False,
    llm: LlmCheck | None = None,
    v1: bool = False,
) -> ExtractPlan:
    """The plan of a POST /v2/extract body; BadRequest with every problem found. `search`: a
    web search provider is configured ([search]); without one a request needing it (no urls, or
    enableWebSearch) is refused. `llm`: what serves the LLM formats the scrape options name.
    `v1`: a /v1/extract body (v1_body), whose document declares the rules of the scrape formats
    it ignores, so they are checked; v2's declares none, and any formats are ignored."""
    raw = json_object(body)
    problems = _raw_problems(raw)
    if problems:
        raise BadRequest(problems)
    request = converted(raw, ExtractRequest, problems)
    urls = request.urls or []
    problems += _request_problems(request, urls, search)
    valid, invalid = _checked_urls(request, urls, problems)
    options, warnings = _page_options(request, browser, llm if v1 else None, problems, v1)
    webhook, more = webhook_of(request.webhook)
    problems += more
    if problems:
        raise BadRequest(problems)
    return ExtractPlan(
        urls=valid,
        prompt=request.prompt,
        system_prompt=request.systemPrompt,
        schema=request.schema,
        limit=request.limit or DEFAULT_LIMIT,
        ignore_sitemap=request.ignoreSitemap,
        include_subdomains=request.includeSubdomains,
        allow_external_links=request.allowExternalLinks or request.enableWebSearch,
        web_search=bool(search and (request.enableWebSearch or not urls)),
        options=options,
        show_sources=request.showSources,
        timeout=request.timeout,
        webhook=webhook,
        provider=request.provider,
        invalid_urls=invalid,
        warning=" ".join(warnings),
    )


def _raw_problems(raw: dict[str, Any]) -> list[Problem]:
    """The keys of the body as read (unknown keys, the client's fields, the schema); the
    experimental keys are dropped and the schema normalised in `raw`."""
    problems = unknown_keys(raw, _KEYS, "$") + client_field_problems(raw, "$")
    nested = raw.get("scrapeOptions")
    if isinstance(nested, dict):
        problems += unknown_keys(
            nested, frozenset(ScrapeOptions.__struct_fields__), "$.scrapeOptions"
        )
        problems += client_field_problems(nested, "$.scrapeOptions")
    if raw.pop("__experimental_showSources", False) is True:
        raw.setdefault("showSources", True)
    for key in _EXPERIMENTAL:
        raw.pop(key, None)
    if raw.get("schema") is not None:
        if isinstance(raw["schema"], dict):
            raw["schema"] = llm_rules.normalize_schema(raw["schema"])
        problems += schema_problems(raw["schema"])
    return problems


def _request_problems(request: ExtractRequest, urls: list[str], search: bool) -> list[Problem]:
    problems: list[Problem] = []
    if not urls and not request.prompt:
        problems.append(problem("$.urls", NEED_URLS_OR_PROMPT))
    elif not urls and not search:
        problems.append(
            problem("$.urls", "required: extracting without urls needs a web search, and no"
                     " search provider is configured ([search])")
        )  # fmt: skip
    if len(urls) > MAX_URLS:
        problems.append(problem("$.urls", TOO_MANY_URLS))
    if request.enableWebSearch and not search:
        problems.append(
            problem("$.enableWebSearch", "web search is not configured on this crawld"
                     " ([search]); send enableWebSearch: false (or leave it out) and list the"
                     " urls")
        )  # fmt: skip
    if search and (request.enableWebSearch or not urls) and not request.prompt:
        problems.append(problem("$.prompt", "required for a web search: what to search for"))
    if request.agent:
        problems.append(problem("$.agent", "agents (FIRE-1) are not supported by crawld"))
    if request.threatProtection:
        problems.append(problem("$.threatProtection", "not supported by crawld"))
    if request.provider is not None and not request.provider:
        problems.append(problem("$.provider", "a provider name from [llm.providers]"))
    return problems


def _checked_urls(
    request: ExtractRequest, urls: list[str], problems: list[Problem]
) -> tuple[list[str], list[str]]:
    """(valid, invalid) URLs; an invalid one is a problem added to `problems` unless
    ignoreInvalidURLs."""
    valid: list[str] = []
    invalid: list[str] = []
    for i, url in enumerate(urls):
        bad = url_problems(url, f"$.urls[{i}]")
        if not bad:
            valid.append(url.strip())
        elif request.ignoreInvalidURLs:
            invalid.append(url[:2048])
        else:
            problems += bad
    if urls and not valid and not problems and not request.enableWebSearch:
        problems.append(problem("$.urls", "No valid URLs provided"))
    return valid, invalid


def _page_options(
    request: ExtractRequest,
    browser: bool,
    llm: LlmCheck | None,
    problems: list[Problem],
    check_formats: bool,
) -> tuple[ScrapeOptions, list[str]]:
    """The scrape options of every page (markdown only) and the warnings; their problems are
    added to `problems`."""
    given = request.scrapeOptions
    options = ScrapeOptions(**msgspec.structs.asdict(given)) if given else ScrapeOptions()
    warnings: list[str] = []
    given_problems: list[Problem] = []
    if any(f not in ("markdown", {"type": "markdown"}) for f in options.formats):
        warnings.append("scrapeOptions.formats is ignored: /v2/extract reads each page as markdown")
    if check_formats and options.formats != ["markdown"]:
        # ignored, but still held to the rules v1's document declares for them
        given_problems, _ = check_scrape_options(
            options, "$.scrapeOptions", browser=browser, llm=llm
        )
    options.formats = ["markdown"]
    more, warning = check_scrape_options(options, "$.scrapeOptions", browser=browser)
    problems += more + [p for p in given_problems if p not in more]
    if warning:
        warnings.append(warning)
    return options, warnings


def v1_body(body: bytes) -> bytes:
    """A POST /v1/extract body as the v2 body it means: `ignoreInvalidURLs` defaults to false,
    `scrapeOptions` are v1's (converted by daemon/crawl/v1/translate.py) with `onlyMainContent`
    false by default (V1T)."""
    raw = json_object(body)
    raw.setdefault("ignoreInvalidURLs", False)
    nested = raw.get("scrapeOptions")
    if nested is None:
        raw["scrapeOptions"] = {"onlyMainContent": False}
    elif isinstance(nested, dict):
        problems = unknown_keys(nested, v1.V1_SCRAPE_OPTIONS, "$.scrapeOptions")
        options, more = v1.scrape_options(nested, "$.scrapeOptions")
        if problems or more:
            raise BadRequest(problems + more)
        options.setdefault("onlyMainContent", False)
        raw["scrapeOptions"] = options
    return msgspec.json.encode(raw)


_plan_decoder = msgspec.json.Decoder(ExtractPlan)


def decode_plan(raw: bytes) -> ExtractPlan:
    return _plan_decoder.decode(raw)


def instruction(plan: ExtractPlan) -> str | None:
    """What the model is asked besides the schema: the system prompt, then the prompt."""
    parts = [p for p in (plan.system_prompt, plan.prompt) if p]
    return "\n\n".join(parts) or None


# -- responses ---------------------------------------------------------------------------------


class ExtractStarted(msgspec.Struct, kw_only=True, omit_defaults=True):
    success: bool
    id: str
    urlTrace: list[Any]
    """Always `[]`: crawld keeps no URL trace (Firecrawl fills it only with urlTrace: true)."""
    invalidURLs: list[str] | None = None
    warning: str | None = None


class ExtractStatus(msgspec.Struct, kw_only=True, omit_defaults=True):
    """GET /v2/extract/{id}: `data` is `[]` until completed, then the merged object."""

    success: bool
    status: str
    """processing | completed | failed | cancelled"""
    data: Any
    error: str | None = None
    warning: str | None = None
    expiresAt: str
    sources: dict[str, list[str]] | None = None
    """Only when the request set showSources."""
    tokensUsed: int | None = None
    """Model tokens (prompt + completion) this job spent; once completed."""
