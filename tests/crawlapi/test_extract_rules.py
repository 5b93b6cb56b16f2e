"""The pure parts of /v2/extract: the merge of per-page answers (following the schema), the
sources of each field, and request validation with Firecrawl's 400s."""

from __future__ import annotations

import json
from typing import Any

import pytest

from daemon.crawl.extract.merge import gather, merge, merge_values, mergeable
from daemon.crawl.extract.models import (
    DEFAULT_LIMIT,
    NEED_URLS_OR_PROMPT,
    TOO_MANY_URLS,
    decode_plan,
    instruction,
    parse_extract,
    wildcard_base,
)
from daemon.crawl.options.models import BadRequest

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "founded": {"type": ["integer", "null"]},
        "people": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "role": {"type": ["string", "null"]}},
            },
        },
        "hq": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_scalars_first_non_null_in_page_order() -> None:
    pages = [("u1", {"name": None, "founded": 2001}), ("u2", {"name": "Acme", "founded": 1999})]
    result, sources = merge(SCHEMA, pages)
    assert result["name"] == "Acme" and result["founded"] == 2001
    assert sources["name"] == ["u2"] and sources["founded"] == ["u1"]


def test_every_schema_property_is_present_even_when_no_page_had_it() -> None:
    result, sources = merge(SCHEMA, [("u1", {"name": "Acme"})])
    assert result == {"name": "Acme", "founded": None, "people": [], "hq": None}
    assert sources == {"name": ["u1"]}


def test_arrays_gather_dedupe_and_merge_agreeing_objects() -> None:
    pages = [
        ("u1", {"people": [{"name": "Ann", "role": None}, {"name": "Bob", "role": "CTO"}]}),
        ("u2", {"people": [{"name": "Ann", "role": "CEO"}, {"name": "Bob", "role": "CTO"}]}),
        ("u3", {"people": [{"name": "Cy", "role": None}]}),
    ]
    result, sources = merge(SCHEMA, pages)
    assert result["people"] == [
        {"name": "Ann", "role": "CEO"},
        {"name": "Bob", "role": "CTO"},
        {"name": "Cy", "role": None},
    ]
    assert sources["people[0]"] == ["u1", "u2"]
    assert sources["people[1]"] == ["u1", "u2"]
    assert sources["people[2]"] == ["u3"]


def test_objects_merge_field_by_field() -> None:
    schema = {"type": "object", "properties": {"hq": {"type": "object", "properties": {
        "city": {"type": "string"}, "zip": {"type": "string"}}}}}  # fmt: skip
    pages = [("u1", {"hq": {"city": "Oslo", "zip": None}}), ("u2", {"hq": {"zip": "0150"}})]
    result, sources = merge(schema, pages)
    assert result == {"hq": {"city": "Oslo", "zip": "0150"}}
    assert sources["hq"] == ["u1", "u2"]


def test_root_array_and_no_schema() -> None:
    schema = {"type": "array", "items": {"type": "string"}}
    result, sources = merge(schema, [("u1", ["a", "b"]), ("u2", ["b", "c"])])
    assert result == ["a", "b", "c"]
    assert sources == {"[0]": ["u1"], "[1]": ["u1", "u2"], "[2]": ["u2"]}
    free, _ = merge(None, [("u1", {"t": "x", "tags": ["p"]}), ("u2", {"t": "y", "tags": ["q"]})])
    assert free == {"t": "x", "tags": ["p", "q"]}


def test_the_merge_is_deterministic_and_only_depends_on_page_order() -> None:
    pages = [("u1", {"name": "A", "people": [{"name": "x"}]}), ("u2", {"name": "B"})]
    assert merge(SCHEMA, pages) == merge(SCHEMA, list(pages))
    assert merge(SCHEMA, pages)[0]["name"] == "A"
    assert merge(SCHEMA, pages[::-1])[0]["name"] == "B"


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ({"n": 1, "r": None}, {"n": 1, "r": 2}, True),
        ({"n": 1}, {"n": 2}, False),
        ({"n": None}, {"r": None}, False),  # nothing in common: not the same entity
        ("x", "x", False),
    ],
)
def test_mergeable(a: Any, b: Any, expected: bool) -> None:
    assert mergeable(a, b) is expected


def test_gather_keeps_first_seen_order() -> None:
    assert gather([[3, 1], [1, 2], [3]]) == [3, 1, 2]
    assert merge_values({"type": "string"}, [None, None]) is None


def _parse(body: dict[str, Any], **kw: Any) -> Any:
    return parse_extract(json.dumps(body).encode(), **kw)


def _problems(body: dict[str, Any], **kw: Any) -> dict[str, str]:
    with pytest.raises(BadRequest) as caught:
        _parse(body, **kw)
    return {d["path"]: d["message"] for d in caught.value.details}


def test_plan_defaults_and_sdk_bodies() -> None:
    body = {"urls": ["https://a.test/docs/*", " https://a.test/x "], "prompt": "p",
            "systemPrompt": "s", "schema": SCHEMA, "showSources": True,
            "origin": "python-sdk@4.55.0", "ignoreInvalidURLs": True}  # fmt: skip
    plan = _parse(body)
    assert plan.urls == ["https://a.test/docs/*", "https://a.test/x"]
    assert plan.limit == DEFAULT_LIMIT and plan.show_sources and plan.include_subdomains
    assert instruction(plan) == "s\n\np"
    assert decode_plan(json.dumps({**json.loads(_encode(plan))}).encode()) == plan
    assert wildcard_base(plan.urls[0]) == "https://a.test/docs/" and wildcard_base("x") is None
    legacy = _parse({"urls": ["https://a.test/"], "prompt": "p",
                     "__experimental_showSources": True})  # fmt: skip
    assert legacy.show_sources


def _encode(plan: Any) -> bytes:
    import msgspec

    return msgspec.json.encode(plan)


def test_schema_is_normalised_as_firecrawl_does() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}},
              "additionalProperties": True, "required": ["a", "ghost"]}  # fmt: skip
    plan = _parse({"urls": ["https://a.test/"], "schema": schema})
    assert plan.schema == {"type": "object", "properties": {"a": {"type": "string"}},
                           "required": ["a"]}  # fmt: skip


@pytest.mark.parametrize(
    ("body", "path", "text"),
    [
        ({}, "$.urls", NEED_URLS_OR_PROMPT),
        ({"urls": ["https://a.test/"] * 11, "prompt": "p"}, "$.urls", TOO_MANY_URLS),
        ({"urls": ["https://a.test/"], "schema": []}, "$.schema", "JSON Schema object"),
        ({"urls": ["https://a.test/"], "schema": {"type": "object", "properties": {"a": {
            "type": "object", "additionalProperties": True}}}}, "$.schema",
         "schema-less dictionary"),
        ({"urls": ["https://a.test/"], "prompt": "p", "enableWebSearch": True},
         "$.enableWebSearch", "web search is not configured"),
        ({"urls": ["https://a.test/"], "prompt": "p", "agent": {"model": "FIRE-1"}}, "$.agent",
         "not supported"),
        ({"urls": ["https://a.test/"], "prompt": "p", "timeout": 10}, "$.timeout", "1000"),
        ({"urls": ["https://a.test/"], "prompt": "p", "scrapeOptions": {"nope": 1}},
         "$.scrapeOptions.nope", "unrecognized key"),
        ({"urls": ["nope"], "prompt": "p"}, "$.urls", "No valid URLs provided"),
        ({"urls": ["https://a.test/"], "prompt": "p", "webhook": "ftp://x"}, "$.webhook", ""),
        ({"urls": "https://a.test/", "prompt": "p"}, "$.urls", ""),
    ],
)  # fmt: skip
def test_400s(body: dict[str, Any], path: str, text: str) -> None:
    problems = _problems(body)
    assert path in problems and text in problems[path], problems


def test_web_search_passes_once_a_provider_exists() -> None:
    plan = _parse({"urls": ["https://a.test/"], "prompt": "p", "enableWebSearch": True},
                  search=True)  # fmt: skip
    assert plan.urls == ["https://a.test/"] and plan.web_search and plan.allow_external_links
    searched = _parse({"prompt": "p"}, search=True)
    assert searched.urls == [] and searched.web_search
    assert not _parse({"urls": ["https://a.test/"], "prompt": "p"}, search=True).web_search
    assert "$.prompt" in _problems({"urls": ["https://a.test/"], "enableWebSearch": True},
                                   search=True)  # fmt: skip


def test_scrape_formats_are_replaced_by_markdown_with_a_warning() -> None:
    plan = _parse({"urls": ["https://a.test/"], "prompt": "p",
                   "scrapeOptions": {"formats": ["html"], "onlyMainContent": False}})  # fmt: skip
    assert plan.options.formats == ["markdown"] and plan.options.onlyMainContent is False
    assert "scrapeOptions.formats is ignored" in plan.warning
