# The scrape options of Firecrawl v2 (the top level of /v2/scrape and /v2/batch/scrape, a crawl's
# `scrapeOptions`) and their rules. Every request shape (scrape, crawl, batch, search, extract,
# v1) carries them, so they have a room of their own; daemon/crawl/options/models.py reads the
# requests around them.
#
# Options fall in three groups: supported (they change what we fetch or return, including the
# cache options maxAge / minAge / storeInCache / lockdown, served by
# daemon/crawl/cache/documents.py), accepted and ignored because they tune a cloud service we do not
# run (ad blocking, proxies of the basic kind), and refused: because this deployment lacks what
# they need (screenshot and actions without a browser; json, summary, question, highlights, query
# without `[llm]`), or because crawld does not do them at all (branding, product, redactPII...).
# Refusing is a 400 naming the option and saying which of the two it is (daemon/crawl/problems.py
# words both), never silent emptiness; harmless ignored ones that change the result add a
# `warning` to the answer.
#
# /openapi.json is made from ScrapeOptions: msgspec enforces the `Meta` bounds, the checks below
# the rest, declared on the field from the same constants; the formats and actions a deployment
# serves are its deployment schemas (daemon/crawl/options/deployment.py).
from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from daemon.crawl.content import attributes
from daemon.crawl.content.document import FORMATS, DocumentOptions
from daemon.crawl.documents.parsers import PARSER_SCHEMA, parsers_problems
from daemon.crawl.llmwork import rules as ask_rules
from daemon.crawl.options.llm_formats import SERVED as LLM_SERVED
from daemon.crawl.options.llm_formats import LlmCheck, check_format
from daemon.crawl.options.schemas import INTEGRATION, MAX_SAFE_INTEGER, UNSUPPORTED
from daemon.crawl.problems import Problem, not_supported, problem
from daemon.crawl.rendering import render_rules
from daemon.crawl.tracking import changes as tracking
from daemon.jsonvalues import deployment_schema

SCREENSHOT_FORMATS = frozenset({"screenshot", "screenshot@fullPage"})
NOT_SUPPORTED = frozenset(
    {"actions", "branding", "audio", "video", "product", "menu", "rawBase64", "deterministicJson"}
)
"""Format names Firecrawl knows and crawld does not serve, with or without a browser or LLM."""
KNOWN = FORMATS | SCREENSHOT_FORMATS | LLM_SERVED | {"changeTracking", "attributes"}
"""Every format crawld serves (some only with a browser or `[llm]`)."""
MAX_WAIT_FOR = 60_000
MAX_SELECTORS = 100
MAX_LANGUAGES, MAX_LANGUAGE = 10, 35
LANGUAGES_SCHEMA = {
    "type": "array", "maxItems": MAX_LANGUAGES,
    "items": {"type": "string", "minLength": 1, "maxLength": MAX_LANGUAGE},
}  # fmt: skip

Millis = Annotated[int, Meta(ge=0, le=MAX_SAFE_INTEGER, description="milliseconds")]
Selectors = Annotated[list[str], Meta(max_length=MAX_SELECTORS)]
WaitFor = Annotated[int, Meta(ge=0, le=MAX_WAIT_FOR, description=(
    "milliseconds to wait for the page (with a browser); at most half of `timeout` when that is"
    " set"))]  # fmt: skip
Timeout = Annotated[int, Meta(ge=1000, le=300_000, description="milliseconds")]
Proxy = Literal["basic", "stealth", "enhanced", "auto"]
Location = Annotated[dict[str, Any], Meta(extra_json_schema={"properties": {
    "languages": {"anyOf": [LANGUAGES_SCHEMA, {"type": "null"}]}}})]  # fmt: skip
Integration = Annotated[str, Meta(extra_json_schema=INTEGRATION)]
Actions = Annotated[list[Any], Meta(extra_json_schema=deployment_schema("ScrapeActions"))]


class ScrapeOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Scrape options: top level of /v2/scrape and /v2/batch/scrape, `scrapeOptions` of a crawl."""

    formats: Annotated[
        list[str | dict[str, Any]], Meta(extra_json_schema=deployment_schema("ScrapeFormats"))
    ] = msgspec.field(default_factory=lambda: ["markdown"])
    onlyMainContent: bool = True
    includeTags: Selectors = []
    excludeTags: Selectors = []
    headers: dict[str, str] = {}
    waitFor: WaitFor = 0
    timeout: Timeout | None = None
    """Milliseconds for the whole page; [crawl] page_timeout when absent."""
    removeBase64Images: bool = True
    skipTlsVerification: bool | None = None
    """Unset: true, false when `headers` are given (daemon/crawl/runs/pages.py)."""
    # The document cache (daemon/crawl/cache/rules.py): Firecrawl's meaning and defaults.
    storeInCache: bool | None = True
    maxAge: Millis | None = None
    """Milliseconds; unset: 2 days (2 years with lockdown); 0: never read the cache."""
    minAge: Millis | None = None
    """Milliseconds; set: from the cache only (404 SCRAPE_NO_CACHED_DATA when none)."""
    lockdown: bool | None = False
    """From the cache only, never fetched (404 SCRAPE_LOCKDOWN_CACHE_MISS when none)."""
    # Accepted and ignored: tuning of Firecrawl's cloud (ads, proxy pools, devices).
    mobile: bool | None = False
    fastMode: bool | None = False
    blockAds: bool | None = True
    proxy: Proxy | None = "auto"
    """Which `[crawl] proxies` pool (docs/how-to/crawl-proxies.md)."""
    location: Location | None = None
    useMock: str | None = None
    profile: dict[str, Any] | None = None
    integration: Integration | None = None
    auditMetadata: dict[str, Any] | None = None
    # Served: PDF and image parsing (daemon/crawl/documents/), and with [crawl.browser] the
    # browser's options.
    parsers: list[Annotated[Any, Meta(extra_json_schema=PARSER_SCHEMA)]] | None = None
    # Refused when set: actions without [crawl.browser]; the others crawld does not do at all.
    actions: Actions | None = None
    redactPII: Annotated[bool | dict[str, Any] | None, UNSUPPORTED] = False
    checkPromptInjection: Annotated[bool | None, UNSUPPORTED] = False
    threatProtection: Annotated[dict[str, Any] | None, UNSUPPORTED] = None
    domainTools: Annotated[bool | None, UNSUPPORTED] = False
    toolDetail: str | None = None


SCRAPE_KEYS = frozenset(ScrapeOptions.__struct_fields__)


def _defaults() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for field in msgspec.structs.fields(ScrapeOptions):
        if field.default is not msgspec.NODEFAULT:
            found[field.name] = field.default
        elif field.default_factory is not msgspec.NODEFAULT:
            found[field.name] = field.default_factory()
    return {name: value for name, value in found.items() if value is not None}


SCRAPE_DEFAULTS = _defaults()
"""Firecrawl's default of every scrape option that has one, as the parser above applies it
(its field defaults): an option given with this value is the same request as one without it
(the document cache keys on the others, daemon/crawl/cache/rules.py)."""


def check_scrape_options(
    options: ScrapeOptions,
    path: str,
    *,
    browser: bool = False,
    llm: LlmCheck | None = None,
    stealth: bool = False,
) -> tuple[list[Problem], str]:
    """Problems (400) and a warning text for the options crawld accepts but ignores.
    `browser`: a browser is configured ([crawl.browser] enabled), so screenshots, actions,
    waitFor, mobile and location.languages are served. `llm`: the LLM service, which serves
    the json and summary formats when `[llm]` is configured."""
    unnamed = [
        problem(f"{path}.formats[{i}]", "a format is a string or an object with `type`")
        for i, fmt in enumerate(options.formats)
        if not isinstance(fmt if isinstance(fmt, str) else fmt.get("type"), str)
    ]
    if unnamed:  # every other rule reads the formats by name
        return unnamed, ""
    problems = _format_problems(options, path, browser, llm)
    problems += _browser_problems(options, path, browser)
    problems += _value_problems(options, path)
    return problems, " ".join(_warnings(options, browser, stealth))


def _format_problems(
    options: ScrapeOptions, path: str, browser: bool, llm: LlmCheck | None
) -> list[Problem]:
    problems: list[Problem] = []
    for i, fmt in enumerate(options.formats):
        name = fmt if isinstance(fmt, str) else fmt.get("type")
        where = f"{path}.formats[{i}]"
        if name in SCREENSHOT_FORMATS:
            if not browser:
                problems.append(
                    problem(where, f"format {name!r} needs a browser; [crawl.browser] is off")
                )
        elif name in NOT_SUPPORTED:
            problems.append(problem(where, not_supported(f"format {name!r}")))
        elif name in LLM_SERVED:
            problems += check_format(fmt, name, where, llm)
        elif name == "changeTracking":
            configured = llm is not None and llm.configured()
            problems += tracking.check_format(fmt, where, options.formats, configured)
        elif name == "attributes":
            problems += attributes.check_format(fmt, where)
        elif name not in FORMATS:
            problems.append(
                problem(where, f"unknown format {str(name)[:50]!r}; supported: {sorted(KNOWN)}")
            )
    return (
        problems
        + ask_rules.repeated(options.formats, path)
        + _repeated_attributes(options.formats, path)
    )


def _repeated_attributes(formats: list[Any], path: str) -> list[Problem]:
    names = [f if isinstance(f, str) else f.get("type") for f in formats]
    extra = [i for i, name in enumerate(names) if name == "attributes"][1:]
    why = "one attributes format per request: list every selector in its `selectors`"
    return [problem(f"{path}.formats[{i}]", why) for i in extra]


def _browser_problems(options: ScrapeOptions, path: str, browser: bool) -> list[Problem]:
    if browser:
        return (render_rules.screenshot_spec(options.formats, path)[1]
                + render_rules.parse_actions(options.actions, f"{path}.actions",
                                             options.waitFor)[1])  # fmt: skip
    if options.actions:
        return [problem(f"{path}.actions", "actions need a browser; [crawl.browser] is off")]
    return []


def _value_problems(options: ScrapeOptions, path: str) -> list[Problem]:
    problems = parsers_problems(options.parsers, f"{path}.parsers")
    for key in ("redactPII", "checkPromptInjection", "domainTools"):
        if getattr(options, key):
            problems.append(problem(f"{path}.{key}", not_supported(key)))
    if options.threatProtection:
        problems.append(problem(f"{path}.threatProtection", "not supported by crawld"))
    if options.waitFor and options.timeout and options.waitFor > options.timeout / 2:
        problems.append(problem(f"{path}.waitFor", "waitFor must not exceed half of timeout"))
    languages = (options.location or {}).get("languages")
    if languages is not None and (
        not isinstance(languages, list)
        or len(languages) > MAX_LANGUAGES
        or not all(isinstance(x, str) and 0 < len(x) <= MAX_LANGUAGE for x in languages)
    ):
        problems.append(problem(f"{path}.location.languages", "a list of language tags"))
    return problems


def _warnings(options: ScrapeOptions, browser: bool, stealth: bool) -> list[str]:
    warnings: list[str] = []
    if options.waitFor and not browser:
        warnings.append("waitFor is ignored: [crawl.browser] is off, pages are not rendered")
    if options.mobile and not browser:
        warnings.append("mobile is ignored: [crawl.browser] is off, pages are not rendered")
    if options.proxy in ("stealth", "enhanced") and not stealth:
        warnings.append(
            f"proxy {options.proxy!r} is served as basic: [crawl] stealth_proxies is empty"
        )
    if (options.location or {}).get("country"):
        warnings.append("location.country is ignored: crawld fetches from where it runs")
    return warnings


def document_options(options: ScrapeOptions) -> DocumentOptions:
    names = {f if isinstance(f, str) else str(f.get("type")) for f in options.formats}
    if names & LLM_SERVED:
        names.add("markdown")  # what the model reads (dropped after unless asked for)
    return DocumentOptions(
        formats=frozenset(names & FORMATS),
        only_main_content=options.onlyMainContent,
        include_tags=tuple(options.includeTags),
        exclude_tags=tuple(options.excludeTags),
        remove_base64_images=options.removeBase64Images,
        attributes=attributes.selectors_of(options.formats),
    )
