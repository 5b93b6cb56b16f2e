"""Crawl prompts with plain values (daemon/crawl/prompts/rules.py): the schema the model answers,
which generated options crawld's own crawl rules keep, and how they meet the request's keys."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from daemon.crawl.prompts.rules import (
    GENERATED_KEYS,
    MAP_URLS,
    SCHEMA,
    checked,
    instructions,
    material,
    merge,
    overridden,
    warning_of,
)
from daemon.llm.rules import schema_problem, strict_schema

URL = "https://docs.example.org/guide/"


def test_the_schema_is_one_the_llm_service_takes_and_allows_nulls() -> None:
    assert schema_problem(SCHEMA) is None
    strict, wrapped = strict_schema(SCHEMA)
    assert not wrapped and strict["required"] == list(GENERATED_KEYS)
    jsonschema.validate(dict.fromkeys(GENERATED_KEYS), SCHEMA)  # every option may stay unset
    jsonschema.validate({**dict.fromkeys(GENERATED_KEYS), "includePaths": ["^/blog/"],
                         "limit": 20, "sitemap": "skip"}, SCHEMA)  # fmt: skip
    assert "ignoreRobotsTxt" not in SCHEMA["properties"]  # never the model's to decide
    assert "maxDepth" not in SCHEMA["properties"]  # v1's, not a /v2/crawl key


def test_what_the_model_is_sent() -> None:
    text = material(URL, [f"https://docs.example.org/p/{i}" for i in range(80)])
    assert text.startswith(f"Start URL: {URL}\n")
    assert text.count("https://docs.example.org/p/") == MAP_URLS
    assert "\n- " not in text  # URLs as lines, not list items
    assert material(URL, []).endswith("(none found)\n")
    assert instructions("  only the blog  ").endswith("The user's request: only the blog")


@pytest.mark.parametrize(
    ("answer", "kept", "dropped"),
    [
        ({"includePaths": ["^/blog/.*"], "limit": 20}, {"includePaths": ["^/blog/.*"], "limit": 20},
         []),
        ({"includePaths": None, "sitemap": None}, {}, []),  # nulls: not generated
        ({"includePaths": ["("]}, {}, ["includePaths"]),  # not a regex crawld compiles
        ({"excludePaths": ["(?=x)"]}, {}, ["excludePaths"]),  # look-ahead: not RE2
        ({"limit": 0}, {}, ["limit"]),
        ({"limit": "ten"}, {}, ["limit"]),
        ({"maxDiscoveryDepth": -1}, {}, ["maxDiscoveryDepth"]),
        ({"delay": 99}, {}, ["delay"]),
        ({"sitemap": "all"}, {}, ["sitemap"]),
        ({"allowSubdomains": "yes"}, {}, ["allowSubdomains"]),
        ({"sitemap": "only", "delay": 2, "crawlEntireDomain": True},
         {"crawlEntireDomain": True, "sitemap": "only", "delay": 2}, []),
        ({"limit": 5, "ignoreRobotsTxt": True, "webhook": "http://x"}, {"limit": 5},
         ["ignoreRobotsTxt, webhook"]),  # not options a prompt sets
    ],
)  # fmt: skip
def test_generated_options_pass_the_crawl_rules_or_are_dropped(
    answer: dict[str, Any], kept: dict[str, Any], dropped: list[str]
) -> None:
    options, said = checked(answer, URL, default_limit=10_000)
    assert options == kept
    assert list(options) == [k for k in GENERATED_KEYS if k in options]  # in a stable order
    assert len(said) == len(dropped)
    for key, warning in zip(dropped, said, strict=True):
        assert warning.startswith(f"generated {key}")


@pytest.mark.parametrize("answer", [None, [], "limit: 5", 3])
def test_an_answer_that_is_no_object_gives_nothing(answer: Any) -> None:
    options, said = checked(answer, URL, default_limit=10_000)
    assert options == {} and len(said) == 1


@pytest.mark.parametrize(
    ("raw", "generated", "merged", "lost"),
    [
        ({"url": URL}, {"limit": 5}, {"url": URL, "limit": 5}, []),
        ({"url": URL, "limit": 2}, {"limit": 5}, {"url": URL, "limit": 2}, ["limit"]),
        ({"url": URL, "limit": None}, {"limit": 5}, {"url": URL, "limit": 5}, []),  # null: unset
        # firecrawl-py sends its defaults explicitly: they win over the prompt
        ({"url": URL, "allowSubdomains": False}, {"allowSubdomains": True},
         {"url": URL, "allowSubdomains": False}, ["allowSubdomains"]),
        ({"url": URL, "sitemap": "skip"}, {"sitemap": "skip"}, {"url": URL, "sitemap": "skip"},
         []),  # the same value: nothing was lost
        ({"url": URL, "includePaths": []}, {"includePaths": ["^/a"]},
         {"url": URL, "includePaths": []}, ["includePaths"]),  # an explicit empty list wins
    ],
)  # fmt: skip
def test_the_request_wins_over_the_prompt(
    raw: dict[str, Any], generated: dict[str, Any], merged: dict[str, Any], lost: list[str]
) -> None:
    assert merge(raw, generated) == merged
    assert overridden(raw, generated) == lost
    said = warning_of([], lost)
    assert (said == "") is (not lost)
    assert all(key in said for key in lost)
