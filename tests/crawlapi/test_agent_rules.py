"""The agent's pure rules in tables: its budget and what it does next (daemon/crawl/agent/loop.py),
what it asks the model and how it reads the answers (prompts.py), and the request's validation
(models.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from daemon.crawl.agent import loop, prompts
from daemon.crawl.agent.loop import Limits, LoopState, Next, Spend
from daemon.crawl.agent.models import parse_agent, provider_of
from daemon.crawl.agent.prompts import Candidate, PageText
from daemon.crawl.problems import BadRequest

# -- budget and next step ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spend", "tpc", "expected"),
    [
        (Spend(), 1000, 0),
        (Spend(pages=3, searches=1), 1000, 4),
        (Spend(tokens=1), 1000, 1),
        (Spend(tokens=1000), 1000, 1),
        (Spend(tokens=1001), 1000, 2),
        (Spend(pages=2, searches=1, tokens=2500), 1000, 6),
        (Spend(tokens=7), 1, 7),
    ],
)
def test_credits(spend: Spend, tpc: int, expected: int) -> None:
    assert loop.credits(spend, tpc) == expected


@pytest.mark.parametrize(
    ("max_steps", "effort", "expected"),
    [(30, None, 30), (30, "high", 30), (30, "medium", 20), (30, "low", 10), (5, "low", 3),
     (30, "unknown", 30)],
)  # fmt: skip
def test_step_cap(max_steps: int, effort: str | None, expected: int) -> None:
    assert loop.step_cap(max_steps, effort) == expected


LIMITS = Limits(max_steps=10, max_credits=100, tokens_per_credit=1000, per_step=3,
                choice_tokens=1000, answer_base=2000, page_tokens=2000, answer_cap=16_000)  # fmt: skip


def state(**kw: Any) -> LoopState:
    base: dict[str, Any] = dict(kicked_off=True, steps=1, chosen=0, candidates=0, read=0,
                                last_choice_empty=False, spend=Spend())  # fmt: skip
    base.update(kw)
    return LoopState(**base)


@pytest.mark.parametrize(
    ("current", "limits", "expected"),
    [
        # The kickoff first, then the request's URLs, all at once.
        (state(kicked_off=False, steps=0), LIMITS, Next("kickoff")),
        (state(chosen=5), LIMITS, Next("read", 5)),
        # A choice when candidates are left, of at most per_step pages.
        (state(candidates=40, read=2), LIMITS, Next("choose", 3)),
        # Nothing left to read: the answer, or a failure when nothing was read.
        (state(read=2), LIMITS, Next("answer", reason="exhausted")),
        (state(read=0), LIMITS, Next("fail", reason="exhausted")),
        (state(candidates=5, read=1, last_choice_empty=True), LIMITS,
         Next("answer", reason="chose_nothing")),
        # The step cap keeps one step for the answer, and a choice needs a read after it.
        (state(steps=9, chosen=2, read=1), LIMITS, Next("answer", reason="steps")),
        (state(steps=7, chosen=4, read=1), LIMITS, Next("read", 2)),
        (state(steps=8, candidates=9, read=1), LIMITS, Next("answer", reason="steps")),
        (state(steps=7, candidates=9, read=1), LIMITS, Next("choose", 1)),
        # The budget: a read is taken only while the answer stays covered.
        (state(chosen=3, read=0), Limits(**{**LIMITS.__dict__, "max_credits": 5}),
         Next("read", 1)),
        (state(chosen=3, read=0), Limits(**{**LIMITS.__dict__, "max_credits": 4}),
         Next("fail", reason="budget")),
        (state(candidates=9, read=1, spend=Spend(pages=1, searches=1)),
         Limits(**{**LIMITS.__dict__, "max_credits": 10}), Next("choose", 1)),
        (state(candidates=9, read=1, spend=Spend(pages=1, searches=1)),
         Limits(**{**LIMITS.__dict__, "max_credits": 9}), Next("answer", reason="budget")),
    ],
)  # fmt: skip
def test_next_step(current: LoopState, limits: Limits, expected: Next) -> None:
    assert loop.next_step(current, limits) == expected


def test_the_loop_always_ends_and_never_overspends() -> None:
    """Simulated runs where every read finds more links: each ends within the step cap, and the
    credits (the answer's estimate included) stay within maxCredits."""
    for max_credits in (3, 6, 10, 25, 2500):
        limits = Limits(**{**LIMITS.__dict__, "max_credits": max_credits})
        s, steps = state(kicked_off=False, steps=0), 0
        while True:
            nxt = loop.next_step(s, limits)
            if nxt.action in ("answer", "fail"):
                break
            steps += max(nxt.count, 1) if nxt.action == "read" else 1
            if nxt.action == "kickoff":
                s = state(steps=1, chosen=2, spend=Spend(searches=1))
            elif nxt.action == "read":
                s = state(steps=s.steps + nxt.count, chosen=s.chosen - nxt.count,
                          read=s.read + nxt.count, candidates=s.candidates + 10,
                          spend=s.spend + Spend(pages=nxt.count))  # fmt: skip
            else:
                s = state(steps=s.steps + 1, chosen=nxt.count, read=s.read,
                          candidates=s.candidates - nxt.count,
                          spend=s.spend + Spend(tokens=limits.choice_tokens))  # fmt: skip
            assert steps < 100
        assert s.steps <= limits.max_steps - 1
        if nxt.action == "answer":
            answer = Spend(tokens=limits.answer_tokens(s.read))
            assert loop.credits(s.spend + answer, 1000) <= max_credits


@pytest.mark.parametrize(
    ("reason", "used", "first", "searched", "expected"),
    [
        ("budget", 2, None, True, "Max credits exceeded: maxCredits (3) does not cover"),
        ("exhausted", 1, "http://a.test/: the page answered HTTP 404", True,
         "No page could be read; http://a.test/: the page answered HTTP 404"),
        ("exhausted", 1, None, True, "No search results found"),
        ("exhausted", 0, None, False, "No page could be read"),
        ("steps", 0, None, False, "No page could be read within the run's step cap"),
    ],
)  # fmt: skip
def test_failure_texts(
    reason: loop.Reason, used: int, first: str | None, searched: bool, expected: str
) -> None:
    text = loop.failure(reason, used=used, max_credits=3, first_error=first, searched=searched)
    assert text.startswith(expected)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [("budget", "maxCredits (5) would not cover"), ("steps", "step cap (30)"),
     ("exhausted", None), ("chose_nothing", None)],
)  # fmt: skip
def test_stop_notes(reason: loop.Reason, expected: str | None) -> None:
    note = loop.stop_note(reason, read=2, max_credits=5, max_steps=30)
    assert (note is None) if expected is None else (note is not None and expected in note)


# -- prompts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("  Find the\nfounders   of Acme ", "Find the founders of Acme"),
        ("word " * 100, ("word " * 80).strip()),
        ("x" * 500, "x" * 400),
    ],
)
def test_search_query(prompt: str, expected: str) -> None:
    assert prompts.search_query(prompt) == expected


def test_candidates_sharing_the_prompts_words_come_first() -> None:
    found = [Candidate("https://a.test/about"), Candidate("https://a.test/pricing", "Pricing"),
             Candidate("https://a.test/blog"), Candidate("https://a.test/plans", "", "pricing")]  # fmt: skip
    shown = prompts.ranked(found, "What is the pricing of the team plans?", 3)
    assert [c.url for c in shown] == [
        "https://a.test/plans", "https://a.test/pricing", "https://a.test/about"
    ]  # fmt: skip


SHOWN = [
    Candidate("https://a.test/x"),
    Candidate("https://a.test/x/y"),
    Candidate("https://b.test/"),
]


@pytest.mark.parametrize(
    ("value", "most", "expected"),
    [
        ({"read": ["https://a.test/x/y", "https://b.test/"]}, 3, ["https://a.test/x/y", "https://b.test/"]),
        ({"read": ["- https://a.test/x/y — About y", "<https://a.test/x>"]}, 3,
         ["https://a.test/x/y", "https://a.test/x"]),
        ({"read": ["https://evil.test/", 7, "https://a.test/x", "https://a.test/x"]}, 3,
         ["https://a.test/x"]),
        ({"read": ["https://a.test/x", "https://b.test/", "https://a.test/x/y"]}, 2,
         ["https://a.test/x", "https://b.test/"]),
        ({"read": []}, 3, []),
        ({"urls": ["https://a.test/x"]}, 3, []),
        (["https://a.test/x"], 3, []),
    ],
)  # fmt: skip
def test_only_shown_candidates_are_chosen(value: Any, most: int, expected: list[str]) -> None:
    assert prompts.chosen_urls(value, SHOWN, most) == expected


def test_choice_content_lists_candidates_one_per_line() -> None:
    read = [PageText("https://a.test/", "Home", "- first item\nsecond line")]
    content = prompts.choice_content(read, [Candidate("https://a.test/x", "X", "about x")])
    lines = content.splitlines()
    assert "[1] https://a.test/ — Home" in lines
    assert "    Excerpt: - first item second line" in lines
    assert [ln for ln in lines if ln.strip().startswith("- ")] == ["- https://a.test/x — X about x"]


PAGES = [PageText("https://a.test/1", "One", "name: Acme Corp\nFounded 1999"),
         PageText("https://a.test/2", "Two", "Nothing here"),
         PageText("https://b.test/3", "Three", "ACME corp makes widgets")]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # The sources the model named, when they are pages it was given.
        ({"data": {"name": "x"}, "sources": ["https://a.test/2", "https://a.test/2"]},
         ["https://a.test/2"]),
        # None it named counts: the pages holding the answer's text.
        ({"data": {"name": "Acme Corp"}, "sources": ["https://evil.test/", "Widget"]},
         ["https://a.test/1", "https://b.test/3"]),
        # Nothing to match: every page given.
        ({"data": {"n": 3}, "sources": []}, [p.url for p in PAGES]),
        ({"data": None}, [p.url for p in PAGES]),
    ],
)  # fmt: skip
def test_answer_sources(value: Any, expected: list[str]) -> None:
    assert prompts.read_answer(value, PAGES).sources == expected


def test_answer_schema_wraps_the_requests() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    wrapped = prompts.answer_schema(schema)
    assert wrapped["properties"]["data"] is schema
    assert wrapped["required"] == ["data", "sources"]
    free = prompts.answer_schema(None)["properties"]["data"]
    assert free["required"] == ["answer"]


def test_answer_content_shares_the_budget() -> None:
    pages = [PageText("https://a.test/1", "One", "a" * 5000), PageText("https://a.test/2", "", "b")]
    content = prompts.answer_content(pages, 2000)
    assert content.startswith("## One\nSource: https://a.test/1\n\n" + "a" * 1000 + " …")
    assert content.endswith("## (no title)\nSource: https://a.test/2\n\nb")


# -- the request -------------------------------------------------------------------------------


def parse(body: dict[str, Any], search: bool = True, **kw: Any) -> Any:
    return parse_agent(json.dumps(body).encode(), search=search, default_credits=2500, **kw)


@pytest.mark.parametrize(
    ("body", "path", "text"),
    [
        ({}, "$.prompt", "required"),
        ({"prompt": "   "}, "$.prompt", "required"),
        ({"prompt": "x" * 10_001}, "$.prompt", "at most 10000"),
        ({"prompt": "x", "schema": "nope"}, "$.schema", "JSON Schema object"),
        ({"prompt": "x", "schema": {"type": "str"}}, "$.schema", "Invalid JSON schema"),
        ({"prompt": "x", "urls": ["ftp://a.test/"]}, "$.urls[0]", "http"),
        ({"prompt": "x", "urls": ["http://a.test/"] * 11}, "$.urls", "at most 10"),
        ({"prompt": "x", "strictConstrainToURLs": True}, "$.urls", "needs the URLs"),
        ({"prompt": "x", "maxCredits": 0}, "$.maxCredits", "positive"),
        ({"prompt": "x", "model": "gpt-9"}, "$.model", "unknown model 'gpt-9'"),
        ({"prompt": "x", "effort": "max"}, "$.effort", "Invalid enum value 'max'"),
        ({"prompt": "x", "threadId": "t"}, "$.threadId", "not supported by crawld"),
        ({"prompt": "x", "mode": "chat"}, "$.mode", "not supported by crawld"),
        ({"prompt": "x", "exchange": {"a": 1}}, "$.exchange", "not supported by crawld"),
        ({"prompt": "x", "zeroDataRetention": True}, "$.zeroDataRetention", "not supported"),
        ({"prompt": "x", "location": {"country": "Germany"}}, "$.location.country", "alpha-2"),
        ({"prompt": "x", "webhook": {"url": "http://h.test/", "events": ["page"]}},
         "$.webhook.events[0]", "an agent event"),
        ({"prompt": "x", "bogus": 1}, "$.bogus", "unrecognized key"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field(body: dict[str, Any], path: str, text: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse(body)
    found = [d for d in caught.value.details if d["path"] == path]
    assert found and text in found[0]["message"], caught.value.details


def test_a_plan_with_its_defaults() -> None:
    plan = parse({"prompt": "Find it", "urls": [" https://a.test/docs/* "],
                  "strictConstrainToURLs": True, "effort": "low", "maxCredits": 50,
                  "location": {"country": "de"}, "origin": "python-sdk@4.55.0",
                  "webhook": {"url": "http://h.test/", "events": ["action", "agent.completed"]}})  # fmt: skip
    assert plan.urls == ["https://a.test/docs/*"] and plan.strict and not plan.search
    assert (plan.max_credits, plan.effort, plan.country, plan.model) == (50, "low", "DE", "spark-2")
    assert plan.options.formats == ["markdown"]
    loose = parse({"prompt": "Find it", "urls": ["https://a.test/"]})
    assert not loose.strict and loose.search and loose.max_credits == 2500
    assert not parse({"prompt": "Find it", "urls": ["https://a.test/"]}, search=False).search


@pytest.mark.parametrize(
    ("model", "models", "known", "expected"),
    [
        (None, {}, frozenset(), None),
        ("spark-1-mini", {}, frozenset(), None),
        ("spark-1-mini", {"spark-1-mini": "small"}, frozenset(), "small"),
        (None, {"spark-2": "big"}, frozenset(), "big"),
        ("local", {}, frozenset({"default", "local"}), "local"),
    ],
)  # fmt: skip
def test_models_map_to_providers(
    model: str | None, models: dict[str, str], known: frozenset[str], expected: str | None
) -> None:
    assert provider_of(model, models, known) == expected
