# The `options` part of POST /v2/parse: the scrape options minus those of a browser, as Firecrawl
# allows them for uploads. firecrawl-py sends its scrape defaults with them (`fastMode`, `mobile:
# false`, ...) and drops the cache options itself ("parse is always uncached"); what would need a
# page in a browser (actions, waitFor, location, mobile, screenshots, changeTracking, branding,
# audio/video, a proxy other than basic/auto) is a 400 with the SDK's own words, and the cache
# options are accepted and ignored: an upload is never read from nor written to the cache.
from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from daemon.crawl.options.llm_formats import LlmCheck
from daemon.crawl.options.models import client_field_problems
from daemon.crawl.options.schemas import UNSUPPORTED, body_model, borrowed
from daemon.crawl.options.scrape_options import SCRAPE_KEYS, ScrapeOptions, check_scrape_options
from daemon.crawl.problems import BadRequest, Problem, converted, problem, unknown_keys
from daemon.jsonvalues import deployment_schema

__all__ = ["ParseOptions", "ParseRequest", "parse_options"]

_ALLOWED = frozenset(
    {"formats", "onlyMainContent", "includeTags", "excludeTags", "headers", "timeout",
     "parsers", "skipTlsVerification", "removeBase64Images", "blockAds", "redactPII", "proxy",
     "integration", "fastMode", "mobile", "waitFor", "actions", "location"}
)  # fmt: skip
_DROPPED = frozenset({"origin", "zeroDataRetention", "maxAge", "minAge", "storeInCache",
                      "lockdown"})  # fmt: skip
_REFUSED_FORMATS = {
    "changeTracking": "change tracking", "screenshot": "screenshot output",
    "screenshot@fullPage": "screenshot output", "branding": "branding output",
    "audio": "audio output", "video": "video output",
}  # fmt: skip


_NOT_READ = Meta(description="accepted and not read: an upload is never cached")
ParseOptions = body_model(
    "ParseOptions",
    "The `options` part of POST /v2/parse: the scrape options an upload takes.",
    borrowed(
        ScrapeOptions,
        _ALLOWED - {"actions", "waitFor", "location", "mobile", "proxy", "formats"},
        formats=(Annotated[list[str | dict[str, Any]], Meta(
            extra_json_schema=deployment_schema("ParseFormats"))],
            msgspec.field(default_factory=lambda: ["markdown"])),
        proxy=(Annotated[str | None, Meta(extra_json_schema={"enum": ["auto", "basic", None]})],
               None),
        actions=(Annotated[Any, UNSUPPORTED], None),
        mobile=(Annotated[Any, UNSUPPORTED], None),
        location=(None, None),
        waitFor=(Annotated[Any, Meta(extra_json_schema={
            "not": {"type": "number", "exclusiveMinimum": 0},
            "description": "not read; a positive number is refused (no browser)"})], None),
        origin=(str | None, None),
        zeroDataRetention=(bool, False),
        **{key: (Annotated[Any, _NOT_READ], None)
           for key in ("maxAge", "minAge", "storeInCache", "lockdown")},
    ),
    module=__name__,
)  # fmt: skip


class ParseRequest(msgspec.Struct, kw_only=True):
    options: ScrapeOptions
    zeroDataRetention: bool = False
    warning: str = ""


def parse_options(raw: dict[str, Any], *, llm: LlmCheck | None = None) -> ParseRequest:
    """The upload's options (already a JSON object); BadRequest naming every problem."""
    problems = unknown_keys(raw, _ALLOWED | _DROPPED, "$.options")
    refused = _browser_problems(raw)
    problems += client_field_problems(raw, "$.options") + refused
    zdr = raw.get("zeroDataRetention", False)
    if not isinstance(zdr, bool):
        problems.append(problem("$.options.zeroDataRetention", "true or false"))
    kept = {k: v for k, v in raw.items() if k in SCRAPE_KEYS and k in _ALLOWED}
    kept.update(maxAge=0, storeInCache=False)
    for key in ("actions", "waitFor", "location", "mobile"):
        kept.pop(key, None)
    options = converted(kept, ScrapeOptions, problems)
    more, warning = check_scrape_options(options, "$.options", llm=llm)
    said = {p["path"] for p in refused}  # not also "needs a browser" for a refused format
    problems += [p for p in more if p["path"] not in said]
    if problems:
        raise BadRequest(problems)
    return ParseRequest(options=options, zeroDataRetention=zdr is True, warning=warning)


def _browser_problems(raw: dict[str, Any]) -> list[Problem]:
    out = []
    if raw.get("actions"):
        out.append(problem("$.options.actions", "Parse uploads do not support actions."))
    wait = raw.get("waitFor")
    if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 0:
        out.append(problem("$.options.waitFor", "Parse uploads do not support waitFor."))
    if raw.get("location") is not None:
        out.append(
            problem("$.options.location", "Parse uploads do not support location overrides.")
        )
    if raw.get("mobile"):
        out.append(problem("$.options.mobile", "Parse uploads do not support mobile rendering."))
    if raw.get("proxy") not in (None, "auto", "basic"):
        out.append(
            problem("$.options.proxy", "Parse uploads only support proxy values of auto or basic.")
        )
    formats = raw.get("formats")
    for i, fmt in enumerate(formats if isinstance(formats, list) else []):
        name = fmt if isinstance(fmt, str) else fmt.get("type") if isinstance(fmt, dict) else None
        if isinstance(name, str) and name in _REFUSED_FORMATS:
            what = _REFUSED_FORMATS[name]
            out.append(problem(f"$.options.formats[{i}]", f"Parse uploads do not support {what}."))
    return out
