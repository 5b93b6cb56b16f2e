# Request and response shapes of Firecrawl v2's /agent as firecrawl-py 4.55 and firecrawl-mcp
# 3.26 send and read them. The body is read as Firecrawl reads it (a strict object: an unknown
# key is a 400 naming it), every problem is collected into one 400, and what crawld does not do
# (threads, chat mode, exchange providers, zero data retention) is refused by name, never
# silently dropped. The validated request becomes an AgentPlan stored with the job, so a
# restarted daemon works on exactly what was accepted.
#
# The answers carry only the keys firecrawl-mcp's output schemas allow (the MCP drops any other
# one, its client refuses it): no `warning`, `createdAt` or `stopReason`; how a run stopped early
# is said in `message`.
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from daemon.config import WebhookSpec, WebhookURL
from daemon.crawl.agent.config import FIRECRAWL_MODELS
from daemon.crawl.options.models import (
    ScrapeOptions,
    check_scrape_options,
    client_field_problems,
    url_problems,
    webhook_of,
)
from daemon.crawl.options.schemas import (
    HTTP_URL,
    JSON_SCHEMA,
    MAX_SAFE_INTEGER,
    NOT_BLANK,
    UNSUPPORTED,
)
from daemon.crawl.options.scrape_options import Integration
from daemon.crawl.problems import BadRequest, Problem, converted, json_object, problem, unknown_keys
from daemon.jobs.events import event_names
from daemon.jsonvalues import deployment_schema
from daemon.llm import rules as llm_rules

MAX_PROMPT = 10_000
MAX_URLS = 10
DEFAULT_MODEL = FIRECRAWL_MODELS[0]
Effort = Literal["low", "medium", "high"]
COUNTRY = re.compile(r"[A-Za-z]{2}")
AGENT_WEBHOOK = {"properties": {"events": {"items": {"enum": [
    *event_names("agent"), *(f"agent.{name}" for name in event_names("agent"))]}}}}  # fmt: skip
"""An agent's webhook: its events are the agent's own (as _webhook_problems checks them)."""
AgentWebhook = Annotated[WebhookURL | WebhookSpec | None, Meta(extra_json_schema=AGENT_WEBHOOK)]
Prompt = Annotated[str, Meta(extra_json_schema={"maxLength": MAX_PROMPT, **NOT_BLANK})]
Location = Annotated[dict[str, Any], Meta(extra_json_schema={
    "required": ["country"],
    "properties": {"country": {"type": "string", "pattern": f"^{COUNTRY.pattern}$"}},
    "description": "{country}: an ISO 3166-1 alpha-2 code such as DE"})]  # fmt: skip
Mode = Annotated[Literal["extract", "chat"], Meta(extra_json_schema={
    "not": {"const": "chat"}, "description": "chat mode is refused by crawld"})]  # fmt: skip
AGENT_URL = {**HTTP_URL, "description": "a URL ending in /* reads the links under it"}


class AgentRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body of POST /v2/agent."""

    prompt: (
        Annotated[str, Meta(extra_json_schema={"maxLength": MAX_PROMPT, **NOT_BLANK})] | None
    ) = None
    urls: Annotated[
        list[Annotated[str, Meta(extra_json_schema=AGENT_URL)]],
        Meta(extra_json_schema={"maxItems": MAX_URLS}),
    ] | None = None  # fmt: skip
    schema: Annotated[dict[str, Any], Meta(extra_json_schema=JSON_SCHEMA)] | None = None
    maxCredits: (
        Annotated[int, Meta(le=MAX_SAFE_INTEGER, extra_json_schema={"minimum": 1})] | None
    ) = None
    """A budget of credits: one per page read and per web search, one per `[agent]
    tokens_per_credit` model tokens."""
    strictConstrainToURLs: bool = False
    """Read only `urls` (and, for a URL ending in `/*`, the links under it); no web search."""
    model: Annotated[str, Meta(extra_json_schema=deployment_schema("AgentModel"))] | None = None
    """spark-2 (default), spark-1-pro, spark-1-mini, or an `[llm.providers]` name."""
    effort: Effort | None = None
    """Share of `[agent] max_steps` the run may use: low a third, medium two thirds."""
    webhook: Annotated[WebhookURL | WebhookSpec | None, Meta(extra_json_schema=AGENT_WEBHOOK)] = (
        None
    )
    location: Location | None = None
    """`{country}`: the web search is localised to it."""
    mode: Mode | None = None
    threadId: Annotated[str | None, UNSUPPORTED] = None
    exchange: Annotated[dict[str, Any] | None, UNSUPPORTED] = None
    zeroDataRetention: Annotated[bool | None, UNSUPPORTED] = None
    threatProtection: Annotated[dict[str, Any] | None, UNSUPPORTED] = None
    auditMetadata: dict[str, Any] | None = None
    integration: Integration | None = None
    origin: str | None = None


def agent_schemas(*, search: bool, models: Any, providers: frozenset[str]) -> dict[str, Any]:
    """`AgentModel` (the models this deployment runs) and `AgentRules` (without [search] an
    agent needs urls)."""
    names = sorted({*FIRECRAWL_MODELS, *models, *providers})
    urls = {"required": ["urls"], "properties": {"urls": {"type": "array", "minItems": 1}}}
    strict = {"required": ["strictConstrainToURLs"],
              "properties": {"strictConstrainToURLs": {"const": True}}}  # fmt: skip
    prompt = {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}}
    rules: list[dict[str, Any]] = [prompt, {"if": strict, "then": urls}]
    if not search:
        rules.append(urls)
    said = "a prompt; strictConstrainToURLs needs urls"
    said += "" if search else "; without [search] urls are needed"
    return {"AgentModel": {"enum": names}, "AgentRules": {"allOf": rules, "description": said}}


AgentBody = Annotated[AgentRequest, Meta(extra_json_schema=deployment_schema("AgentRules"))]


_KEYS = frozenset(AgentRequest.__struct_fields__)
_NOT_SUPPORTED = {
    "threadId": "follow-up turns (threads) are not supported by crawld",
    "exchange": "data providers (exchange) are not supported by crawld",
    "threatProtection": "not supported by crawld",
}


class AgentPlan(msgspec.Struct, kw_only=True):
    """A validated agent request with every default applied; stored with the job."""

    prompt: str
    urls: list[str]
    """In the request's order; a `/*` URL keeps its suffix (its links under it may be read)."""
    schema: dict[str, Any] | None
    max_credits: int
    strict: bool
    model: str
    """As requested (DEFAULT_MODEL when absent): what GET answers in `model`."""
    provider: str | None
    """The `[llm.providers]` name that answers (None: `[llm]` itself)."""
    effort: str | None
    webhook: WebhookSpec | None
    search: bool
    """The run starts with a web search for the prompt."""
    country: str | None = None
    options: ScrapeOptions = msgspec.field(
        default_factory=lambda: ScrapeOptions(formats=["markdown"])
    )


def _markdown() -> ScrapeOptions:
    return ScrapeOptions(formats=["markdown"])


def wildcard_base(url: str) -> str | None:
    """`https://site/docs/*` → `https://site/docs/`; None for a URL without the `/*` suffix."""
    return url[:-1] if url.endswith("/*") else None


def provider_of(model: str | None, models: dict[str, str], known: frozenset[str]) -> str | None:
    """The `[llm.providers]` name a request's `model` runs on (None: `[llm]` itself);
    ValueError for a model that names nothing."""
    if model is None:
        return models.get(DEFAULT_MODEL)
    if model in models:
        return models[model]
    if model in FIRECRAWL_MODELS:
        return None
    if model in known:
        return model
    raise ValueError(
        f"unknown model {model[:64]!r}: use one of {', '.join(FIRECRAWL_MODELS)} or an"
        f" [llm.providers] name (configured: {', '.join(sorted(known)) or 'none'})"
    )


def parse_agent(
    body: bytes,
    *,
    search: bool,
    default_credits: int,
    models: dict[str, str] | None = None,
    providers: frozenset[str] = frozenset(),
) -> AgentPlan:
    """The plan of a POST /v2/agent body; BadRequest with every problem found. `search`: a web
    search provider is configured; `models`: `[agent] models`; `providers`: the configured
    `[llm.providers]` names."""
    raw = json_object(body)
    problems = unknown_keys(raw, _KEYS, "$") + client_field_problems(raw, "$")
    schema = raw.pop("schema", None)
    if schema is not None:
        if isinstance(schema, dict):
            schema = llm_rules.normalize_schema(schema)
        if (found := llm_rules.schema_problem(schema)) is not None:
            problems.append(problem("$.schema", found))
    request = converted(raw, AgentRequest, problems)
    problems += _request_problems(request)
    urls = [u.strip() for u in request.urls or []]
    for i, url in enumerate(urls):
        problems += url_problems(url.removesuffix("*"), f"$.urls[{i}]")
    try:
        provider = provider_of(request.model, models or {}, providers)
    except ValueError as exc:
        problems.append(problem("$.model", str(exc)))
        provider = None
    webhook, more = webhook_of(request.webhook)
    problems += more + _webhook_problems(webhook)
    options = ScrapeOptions(formats=["markdown"])
    more, _ = check_scrape_options(options, "$")
    problems += more
    if problems:
        raise BadRequest(problems)
    assert request.prompt is not None
    country = (request.location or {}).get("country")
    return AgentPlan(
        prompt=request.prompt,
        urls=urls,
        schema=schema,
        max_credits=request.maxCredits or default_credits,
        strict=request.strictConstrainToURLs and bool(urls),
        model=request.model or DEFAULT_MODEL,
        provider=provider,
        effort=request.effort,
        webhook=webhook,
        search=search and not (request.strictConstrainToURLs and urls),
        country=country.upper() if isinstance(country, str) else None,
        options=options,
    )


def _request_problems(request: AgentRequest) -> list[Problem]:
    problems: list[Problem] = []
    if request.prompt is None or not request.prompt.strip():
        problems.append(problem("$.prompt", "required: what the agent should find"))
    elif len(request.prompt) > MAX_PROMPT:
        problems.append(problem("$.prompt", f"at most {MAX_PROMPT} characters"))
    if request.urls is not None and len(request.urls) > MAX_URLS:
        problems.append(problem("$.urls", f"at most {MAX_URLS} URLs"))
    if request.strictConstrainToURLs and not request.urls:
        problems.append(problem("$.urls", "strictConstrainToURLs needs the URLs to keep to"))
    if request.maxCredits is not None and request.maxCredits < 1:
        problems.append(problem("$.maxCredits", "a positive integer"))
    for key, message in _NOT_SUPPORTED.items():
        if getattr(request, key):
            problems.append(problem(f"$.{key}", message))
    if request.mode == "chat":
        problems.append(problem("$.mode", "chat mode is not supported by crawld; use extract"))
    if request.zeroDataRetention:
        problems.append(problem("$.zeroDataRetention", "not supported for agents (as Firecrawl)"))
    country = (request.location or {}).get("country")
    if request.location is not None and not (
        isinstance(country, str) and COUNTRY.fullmatch(country)
    ):
        problems.append(problem("$.location.country", "an ISO 3166-1 alpha-2 code such as DE"))
    return problems


def _webhook_problems(webhook: WebhookSpec | None) -> list[Problem]:
    names = event_names("agent")
    allowed = set(names) | {f"agent.{n}" for n in names}
    return [
        problem(f"$.webhook.events[{i}]", f"an agent event: one of {', '.join(names)}")
        for i, name in enumerate(webhook.events if webhook is not None else [])
        if name not in allowed
    ]


_plan_decoder = msgspec.json.Decoder(AgentPlan)


def decode_plan(raw: bytes) -> AgentPlan:
    return _plan_decoder.decode(raw)


# -- responses ---------------------------------------------------------------------------------


class AgentStarted(msgspec.Struct, kw_only=True):
    """POST /v2/agent: firecrawl-mcp's `firecrawl_agent` allows only agent_hints, success,
    error, id, status, threadId, threadTurn."""

    success: bool
    id: str


class AgentStatus(msgspec.Struct, kw_only=True, omit_defaults=True):
    """GET /v2/agent/{id}, within firecrawl-mcp's `firecrawl_agent_status` keys."""

    success: bool
    id: str
    status: str
    """processing | completed | failed | cancelled (after DELETE; firecrawl-py's model lacks
    it, so its get_agent_status raises on a cancelled run)."""
    model: str
    expiresAt: str
    creditsUsed: int
    data: Any = None
    """The answer once completed: the schema's object, or `{"answer": text}` without one."""
    sources: list[str] | None = None
    """URLs of the pages the answer came from, once completed."""
    error: str | None = None
    message: str | None = None
    """Why a completed run stopped reading early (budget or step cap)."""


class AgentCancelled(msgspec.Struct, kw_only=True):
    success: bool


class AgentStep(msgspec.Struct, kw_only=True):
    step: int
    action: str
    """search | scrape | choose | answer"""
    input: dict[str, Any]
    output: dict[str, Any]
    creditsUsed: int
    """The run's credits once this step was done."""
    at: str
    ms: int
    """How long the step's work took: the fetch, the search or the model call."""
    tokens: int
    """Model tokens the step spent (prompt + completion; 0 from the LLM cache)."""


class AgentSteps(msgspec.Struct, kw_only=True):
    """GET /v2/agent/{id}/steps (crawld's own): every step the run recorded, in order."""

    success: bool
    id: str
    status: str
    creditsUsed: int
    steps: list[AgentStep]
