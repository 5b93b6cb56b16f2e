# What a deployment serves of the scrape options depends on its config: the json and summary
# formats (and changeTracking's json mode) need an [llm], screenshots and actions a browser. The
# request models mark those fields (daemon.jsonvalues.deployment_schema); this module says what
# each mark means under a given config, as JSON schemas for /openapi.json, from the same
# constants the checks in scrape_options.py, llm_formats.py and tracking/changes.py use.
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from daemon.crawl.content import attributes
from daemon.crawl.content.document import FORMATS
from daemon.crawl.llmwork import rules as ask_rules
from daemon.crawl.options.schemas import JSON_SCHEMA, NOT_BLANK, nullable
from daemon.crawl.rendering import render_rules
from daemon.crawl.tracking import changes as tracking
from daemon.llm import rules as llm_rules

SCREENSHOTS = ("screenshot", "screenshot@fullPage")
_VIEWPORT_SIDE = {"type": "integer", "minimum": 100, "maximum": 7680}


def _is(name: str) -> dict[str, Any]:
    """A format entry naming `name`, as a string or as an object's `type`."""
    return {"anyOf": [{"const": name}, {"type": "object", "required": ["type"],
                                         "properties": {"type": {"const": name}}}]}  # fmt: skip


def _closed(name: str, **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": ["type"], "additionalProperties": False,
            "properties": {"type": {"const": name}, **properties}}  # fmt: skip


def _prompt() -> dict[str, Any]:
    return nullable({"type": "string", "maxLength": llm_rules.MAX_PROMPT})


def format_schemas(*, browser: bool, providers: Sequence[str]) -> dict[str, Any]:
    """`ScrapeFormats` (a request's `formats`) and `ScrapeActions` as a deployment with (or
    without) a browser and these `[llm]` providers (none: no [llm]) serves them."""
    llm = bool(providers)
    provider = nullable({"enum": list(providers)}) if llm else {"type": "null"}
    names = [*sorted(FORMATS), "changeTracking"]
    modes = ["git-diff", "json"] if llm else ["git-diff"]
    entries: list[dict[str, Any]] = [
        {"type": "object", "required": ["type"], "properties": {"type": {"enum": sorted(FORMATS)}}},
        _closed("changeTracking", modes={"type": "array", "items": {"enum": modes}},
                schema=nullable(JSON_SCHEMA), prompt=_prompt(),
                tag=nullable({"type": "string", "maxLength": tracking.MAX_TAG})),
        _attributes(),
    ]  # fmt: skip
    if llm:
        names += ["json", "summary"]
        entries += [
            _closed("json", schema=nullable(JSON_SCHEMA), prompt=_prompt(),
                    checkPromptInjection={"type": ["boolean", "null"]}, provider=provider),
            _closed("summary", provider=provider),
            *_asks(provider),
        ]  # fmt: skip
    once = [_once(_is("attributes")), _once(_is("highlights")),
            _once({"anyOf": [_is("question"), _is("query")]})]  # fmt: skip
    rules: list[dict[str, Any]] = [
        {"if": {"contains": _is("changeTracking")}, "then": {"contains": _is("markdown")}},
        *once,
    ]
    if browser:
        names += SCREENSHOTS
        viewport = {"type": "object", "additionalProperties": False,
                    "required": ["width", "height"],
                    "properties": {"width": _VIEWPORT_SIDE, "height": _VIEWPORT_SIDE}}  # fmt: skip
        entries += [
            _closed("screenshot", fullPage={"type": "boolean"}, viewport=nullable(viewport),
                    quality=nullable({"type": "integer", "minimum": 1, "maximum": 100})),
            {"type": "object", "required": ["type"],
             "properties": {"type": {"const": "screenshot@fullPage"}}},
        ]  # fmt: skip
        rules.append(_once({"anyOf": [_is(name) for name in SCREENSHOTS]}))
    formats = {
        "type": "array",
        "items": {"anyOf": [{"enum": names}, *entries]},
        "allOf": rules,
        "description": "changeTracking needs markdown among the formats; one attributes, one"
        " highlights, one of question and query" + (", one screenshot" if browser else ""),
    }
    uploads = {  # /v2/parse: no page, so no change tracking and no screenshot
        "type": "array",
        "items": {"anyOf": [{"enum": [n for n in names if n not in UPLOADS_REFUSE]},
                            *(e for e in entries if not _names(e) & UPLOADS_REFUSE)]},
        "allOf": once,
        "description": "one attributes, one highlights, one of question and query",
    }  # fmt: skip
    return {"ScrapeFormats": formats, "ParseFormats": uploads, **_actions(browser)}


UPLOADS_REFUSE = frozenset({"changeTracking", *SCREENSHOTS})


def _names(entry: dict[str, Any]) -> set[str]:
    """The format names an object entry's `type` allows."""
    kind = entry.get("properties", {}).get("type", {})
    return {kind["const"]} if "const" in kind else set(kind.get("enum", ()))


def _once(entry: dict[str, Any]) -> dict[str, Any]:
    """At most one format matching `entry` (in the form schemathesis generates from)."""
    return {"anyOf": [{"not": {"contains": entry}}, {"contains": entry, "maxContains": 1}]}


def _asks(provider: dict[str, Any]) -> list[dict[str, Any]]:
    """question, highlights and query: objects holding what the model is asked."""
    text = {"type": "string", "maxLength": llm_rules.MAX_PROMPT, **NOT_BLANK}
    found = []
    for name, key in ask_rules.TEXT_KEY.items():
        entry = _closed(name, provider=provider, **{key: text})
        entry["required"] = ["type", key]
        if name == "query":
            entry["properties"]["mode"] = {"enum": list(ask_rules.MODES)}
        found.append(entry)
    return found


def _attributes() -> dict[str, Any]:
    """The attributes format: CSS selectors (Lexbor's syntax) and the attribute each reads."""

    def text(most: int, description: str) -> dict[str, Any]:
        return {"type": "string", "maxLength": most, **NOT_BLANK, "description": description}

    item = {"type": "object", "additionalProperties": False, "required": ["selector", "attribute"],
            "properties": {
                "selector": text(attributes.MAX_SELECTOR_CHARS, "a CSS selector (it parses)"),
                "attribute": text(attributes.MAX_ATTRIBUTE_CHARS, "an attribute name"),
            }}  # fmt: skip
    entry = _closed(
        "attributes",
        selectors={
            "type": "array",
            "minItems": 1,
            "maxItems": attributes.MAX_SELECTORS,
            "items": item,
        },
    )
    entry["required"] = ["type", "selectors"]
    return entry


def _actions(browser: bool) -> dict[str, Any]:
    if not browser:
        return {
            "ScrapeActions": {
                "type": "array",
                "maxItems": 0,
                "description": "actions need a browser: [crawl.browser] is off",
            }
        }
    (schema,), components = msgspec.json.schema_components(
        [list[render_rules.Action]], ref_template="#/components/schemas/{name}"
    )
    schema.update(maxItems=render_rules.MAX_ACTIONS, description=(
        "Firecrawl's actions; a wait names milliseconds or a selector (not both), and the"
        " waits with waitFor come to at most 60 s"))  # fmt: skip
    return {"ScrapeActions": schema, **components}


def provider_schemas(providers: Sequence[str]) -> dict[str, Any]:
    """`LlmProvider`: a name of the `[llm.providers]` this deployment has."""
    return {"LlmProvider": {"enum": list(providers)} if providers else {"not": {}}}
