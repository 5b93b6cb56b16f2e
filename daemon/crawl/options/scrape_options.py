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
from __future__ import annotations

from typing import Any, Literal

import msgspec

from daemon.crawl.content import attributes
from daemon.crawl.content.document import FORMATS, DocumentOptions
from daemon.crawl.documents.parsers import parsers_problems
from daemon.crawl.llmwork import rules as ask_rules
from daemon.crawl.options.llm_formats import SERVED as LLM_SERVED
from daemon.crawl.options.llm_formats import LlmCheck, check_format
from daemon.crawl.problems import Problem, not_supported, problem
from daemon.crawl.rendering import render_rules
from daemon.crawl.tracking import changes as tracking

SCREENSHOT_FORMATS = frozenset({"screenshot", "screenshot@fullPage"})
NOT_SUPPORTED = frozenset(
    {"actions", "branding", "audio", "video", "product", "menu", "rawBase64", "deterministicJson"}
)
"""Format names Firecrawl knows and crawld does not serve, with or without a browser or LLM."""
KNOWN = FORMATS | SCREENSHOT_FORMATS | LLM_SERVED | {"changeTracking", "attributes"}
"""Every format crawld serves (some only with a browser or `[llm]`)."""


class ScrapeOptions(msgspec.Struct, kw_only=True):
    """Scrape options: top level of /v2/scrape and /v2/batch/scrape, `scrapeOptions` of a crawl."""

    formats: list[str | dict[str, Any]] = msgspec.field(default_factory=lambda: ["markdown"])
    onlyMainContent: bool = True
    includeTags: list[str] = []
    excludeTags: list[str] = []
    headers: dict[str, str] = {}
    waitFor: int = 0
    timeout: int | None = None
    """Milliseconds for the whole page; [crawl] page_timeout when absent."""
    removeBase64Images: bool = True
    skipTlsVerification: bool | None = None
    """Unset: true, false when `headers` are given (daemon/crawl/runs/pages.py)."""
    # The document cache (daemon/crawl/cache/rules.py): Firecrawl's meaning and defaults.
    storeInCache: bool | None = True
    maxAge: int | None = None
    """Milliseconds; unset: 2 days (2 years with lockdown); 0: never read the cache."""
    minAge: int | None = None
    """Milliseconds; set: from the cache only (404 SCRAPE_NO_CACHED_DATA when none)."""
    lockdown: bool | None = False
    """From the cache only, never fetched (404 SCRAPE_LOCKDOWN_CACHE_MISS when none)."""
    # Accepted and ignored: tuning of Firecrawl's cloud (ads, proxy pools, devices).
    mobile: bool | None = False
    fastMode: bool | None = False
    blockAds: bool | None = True
    proxy: Literal["basic", "stealth", "enhanced", "auto"] | None = "auto"
    """Which `[crawl] proxies` pool (docs/how-to/crawl-proxies.md)."""
    location: dict[str, Any] | None = None
    useMock: str | None = None
    profile: dict[str, Any] | None = None
    integration: str | None = None
    auditMetadata: dict[str, Any] | None = None
    # Served: PDF and image parsing (daemon/crawl/documents/), and with [crawl.browser] the
    # browser's options.
    parsers: list[Any] | None = None
    # Refused when set: actions without [crawl.browser]; the others crawld does not do at all.
    actions: list[Any] | None = None
    redactPII: bool | dict[str, Any] | None = False
    checkPromptInjection: bool | None = False
    threatProtection: dict[str, Any] | None = None
    domainTools: bool | None = False
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
        if not isinstance(name, str):
            problems.append(problem(where, "a format is a string or an object with `type`"))
        elif name in SCREENSHOT_FORMATS:
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
                problem(where, f"unknown format {name[:50]!r}; supported: {sorted(KNOWN)}")
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
    if options.timeout is not None and not 1000 <= options.timeout <= 300_000:
        problems.append(problem(f"{path}.timeout", "milliseconds between 1000 and 300000"))
    for key in ("maxAge", "minAge"):
        if (value := getattr(options, key)) is not None and value < 0:
            problems.append(problem(f"{path}.{key}", "milliseconds, at least 0"))
    if not 0 <= options.waitFor <= 60_000:
        problems.append(problem(f"{path}.waitFor", "milliseconds between 0 and 60000"))
    elif options.waitFor and options.timeout and options.waitFor > options.timeout / 2:
        problems.append(problem(f"{path}.waitFor", "waitFor must not exceed half of timeout"))
    for field in ("includeTags", "excludeTags"):
        if len(getattr(options, field)) > 100:
            problems.append(problem(f"{path}.{field}", "at most 100 selectors"))
    languages = (options.location or {}).get("languages")
    if languages is not None and (
        not isinstance(languages, list)
        or len(languages) > 10
        or not all(isinstance(x, str) and 0 < len(x) <= 35 for x in languages)
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
