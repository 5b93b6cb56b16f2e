"""The pure rules of feedback validation (daemon/crawl/feedback/rules.py) and developer search
(daemon/crawl/search/developer.py), as tables of values."""

from __future__ import annotations

from typing import Any

import pytest

from daemon.crawl.feedback import rules
from daemon.crawl.problems import BadRequest
from daemon.crawl.search import developer

SID = "5b0c8f64-1d1e-4a57-9a53-0d5b1c2f3e4a"

SEARCH: list[tuple[str, dict[str, Any], list[str]]] = [
    (SID, {"rating": "good"}, []),
    (SID, {"rating": "bad", "querySuggestions": "q", "origin": "mcp-x@1"}, []),
    (SID, {"rating": "partial", "valuableSources": [{"url": "https://a.b/c", "reason": "r"}],
           "missingContent": [{"topic": "t", "description": "d"}]}, []),
    ("not-a-uuid", {"rating": "good"}, ["searchId"]),
    (SID, {}, ["$.rating"]),
    (SID, {"rating": "good", "jobId": SID}, ["$.jobId"]),
    (SID, {"rating": "good", "valuableSources": [{"url": "https://a.b", "x": 1}]},
     ["$.valuableSources[0]"]),
    (SID, {"rating": "good", "valuableSources": [{"url": "https://a.b", "reason": "r" * 1001}]},
     ["$.valuableSources[0].reason"]),
    (SID, {"rating": "good", "valuableSources": [{"url": "https://a.b"}] * 51},
     ["$.valuableSources"]),
    (SID, {"rating": "good", "missingContent": [{"topic": "t" * 201}]},
     ["$.missingContent[0].topic"]),
    (SID, {"rating": "good", "querySuggestions": 3}, ["$.querySuggestions"]),
]  # fmt: skip


@pytest.mark.parametrize(("sid", "raw", "paths"), SEARCH)
def test_search_feedback(sid: str, raw: dict[str, Any], paths: list[str]) -> None:
    assert [p["path"] for p in rules.search_problems(sid, raw)] == paths


JOB: list[tuple[dict[str, Any], list[str]]] = [
    ({"endpoint": "scrape", "jobId": SID, "rating": "good"}, []),
    ({"endpoint": "alexandria", "rating": "good", "rationale": "r",
      "requestedWebsite": {"url": "https://a.b"}, "providerFeedback": [{"name": "p"}]}, []),
    ({"endpoint": "map", "jobId": SID, "rating": "good", "tags": ["a-b_1"], "pageNumbers": [1],
      "metadata": {"k": 1}, "url": "http://a.b/"}, []),
    ({"endpoint": "crawl", "jobId": SID, "rating": "good"}, ["$.endpoint"]),
    ({"endpoint": "parse", "rating": "good"}, ["$.jobId"]),
    ({"endpoint": "parse", "jobId": SID, "rating": "good", "pageNumbers": [True]},
     ["$.pageNumbers"]),
    ({"endpoint": "parse", "jobId": SID, "rating": "good", "issues": ["x"] * 21}, ["$.issues"]),
    ({"endpoint": "parse", "jobId": SID, "rating": "good", "metadata": []}, ["$.metadata"]),
    ({"endpoint": "parse", "jobId": SID, "rating": "good", "capabilityFeedback": ["x"]},
     ["$.capabilityFeedback"]),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "paths"), JOB)
def test_job_feedback(raw: dict[str, Any], paths: list[str]) -> None:
    assert [p["path"] for p in rules.job_problems(raw)] == paths


@pytest.mark.parametrize(("url", "expected"), [
    ("https://github.com/python-trio/trio/issues/12", "issue:python-trio/trio#12"),
    ("https://github.com/python-trio/trio/pull/7", "pr:python-trio/trio#7"),
    ("https://github.com/python-trio/trio", "readme:python-trio/trio"),
    ("https://github.com/python-trio/trio/", "readme:python-trio/trio"),
])  # fmt: skip
def test_result_ids(url: str, expected: str) -> None:
    assert developer.result_id(url) == expected


def test_other_pages_get_a_stable_doc_id() -> None:
    one = developer.result_id("https://docs.python.org/3/library/asyncio.html")
    assert one.startswith("doc:") and len(one) == 20
    assert one == developer.result_id("https://docs.python.org/3/library/asyncio.html")
    assert developer.result_id("https://github.com/a/b/blob/main/x.py").startswith("doc:")


@pytest.mark.parametrize(("raw", "body", "passages"), [
    ({"query": "q"}, {"query": "q", "limit": 10, "categories": ["developer"]}, 3),
    ({"query": "q", "k": "5", "passages": "2"},
     {"query": "q", "limit": 5, "categories": ["developer"]}, 2),
])  # fmt: skip
def test_search_body(raw: dict[str, Any], body: dict[str, Any], passages: int) -> None:
    assert developer.search_body(raw, from_query=True) == (body, passages)


def test_a_json_body_takes_numbers_as_numbers() -> None:
    # the document says integer: "5" in a JSON body is refused, as in a search body
    with pytest.raises(BadRequest):
        developer.search_body({"query": "q", "k": "5"})


@pytest.mark.parametrize(("raw", "path"), [
    ({}, "$.query"), ({"query": " "}, "$.query"), ({"query": "q", "k": 101}, "$.k"),
    ({"query": "q", "passages": 6}, "$.passages"), ({"query": "q", "skills": "only"}, "$.skills"),
    ({"query": "q", "min_stars": 3}, "$.min_stars"), ({"query": "q", "x": 1}, "$.x"),
])  # fmt: skip
def test_search_body_refusals(raw: dict[str, Any], path: str) -> None:
    with pytest.raises(BadRequest) as refused:
        developer.search_body(raw)
    assert [d["path"] for d in refused.value.details] == [path]


def test_results_keep_rank_and_cap_passages() -> None:
    answer = {"data": {"web": [
        {"url": "https://github.com/a/b/issues/1", "title": "T", "description": "p1\n\np2\n\np3"},
        {"url": "https://x.org/d", "description": ""},
    ]}}  # fmt: skip
    got = developer.results(answer, 2)
    assert got[0] == {"id": "issue:a/b#1", "url": "https://github.com/a/b/issues/1", "title": "T",
                      "passages": [{"text": "p1"}, {"text": "p2"}]}  # fmt: skip
    assert got[1]["title"] == "https://x.org/d" and got[1]["passages"] == []
