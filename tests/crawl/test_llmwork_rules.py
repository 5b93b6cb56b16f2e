"""The rules of the question, highlights and query formats (daemon/crawl/llmwork/rules.py): what a
format object may hold, what a job asks of the model, and the verbatim check that keeps every
highlight text of the page."""

from __future__ import annotations

from typing import Any

import pytest

from daemon.crawl.llmwork import rules
from daemon.crawl.llmwork.rules import AskSpec

Q = {"type": "question", "question": "What does it cost?"}
H = {"type": "highlights", "query": "price"}


@pytest.mark.parametrize(
    ("fmt", "path", "message"),
    [
        ("question", "$.f.question", 'send {"type": "question", "question": "..."}'),
        ("highlights", "$.f.query", 'send {"type": "highlights", "query": "..."}'),
        ("query", "$.f.prompt", 'send {"type": "query", "prompt": "..."}'),
        ({"type": "question"}, "$.f.question", "a non-empty string"),
        ({"type": "question", "question": "  "}, "$.f.question", "a non-empty string"),
        ({"type": "question", "question": 5}, "$.f.question", "a non-empty string"),
        ({"type": "question", "question": "x" * 10_001}, "$.f.question", "at most 10000"),
        ({"type": "highlights", "query": "x", "question": "y"}, "$.f.question", "unrecognized"),
        ({"type": "question", "question": "x", "query": "y"}, "$.f.query", "unrecognized"),
        ({"type": "query", "prompt": "x", "mode": "quote"}, "$.f.mode", "'freeform' or"),
        ({"type": "query", "prompt": ""}, "$.f.prompt", "a non-empty string"),
    ],
)
def test_bad_formats(fmt: Any, path: str, message: str) -> None:
    name = fmt if isinstance(fmt, str) else fmt["type"]
    problems = rules.check_format(fmt, name, "$.f")
    assert any(p["path"] == path and message in p["message"] for p in problems), problems


@pytest.mark.parametrize(
    "fmt",
    [Q, H, {"type": "query", "prompt": "x"}, {"type": "query", "prompt": "x", "mode": "directQuote"},
     {"type": "question", "question": "x" * 10_000, "provider": "big"}],
)  # fmt: skip
def test_good_formats(fmt: dict[str, Any]) -> None:
    assert rules.check_format(fmt, fmt["type"], "$.f") == []


@pytest.mark.parametrize(
    ("formats", "bad"),
    [
        (["markdown", Q, H], []),
        ([Q, {"type": "query", "prompt": "p"}], ["$.formats[1]"]),
        ([H, "markdown", H], ["$.formats[2]"]),
        ([Q, Q, H, H], ["$.formats[1]", "$.formats[3]"]),
    ],
)
def test_one_format_per_field(formats: list[Any], bad: list[str]) -> None:
    assert [p["path"] for p in rules.repeated(formats, "$")] == bad


def test_asks() -> None:
    assert rules.asks(["markdown", {"type": "json"}]) == ()
    assert rules.asks([Q | {"provider": "p"}, H]) == (
        AskSpec(field="answer", verbatim=False, text="What does it cost?", provider="p"),
        AskSpec(field="highlights", verbatim=True, text="price"),
    )
    assert rules.asks([{"type": "query", "prompt": "x"}]) == (
        AskSpec(field="answer", verbatim=False, text="x"),)  # fmt: skip
    assert rules.asks([{"type": "query", "prompt": "x", "mode": "directQuote"}]) == (
        AskSpec(field="answer", verbatim=True, text="x"),)  # fmt: skip


def test_instructions_carry_the_question() -> None:
    prompt, schema = rules.instructions(AskSpec(field="answer", verbatim=False, text="Why?"))
    assert prompt.endswith("\nQuestion: Why?") and schema["properties"] == {
        "answer": {"type": "string"}}  # fmt: skip
    prompt, schema = rules.instructions(AskSpec(field="highlights", verbatim=True, text="q"))
    assert "exactly as it is written" in prompt and prompt.endswith("\nQuery: q")
    assert schema["properties"]["passages"]["type"] == "array"


PAGE = """# Prices

The basic plan costs **12 EUR** a month.
The pro plan costs 30 EUR
a month, billed yearly.

- Free trial: 14 days
- Cancel any time"""


@pytest.mark.parametrize(
    ("passages", "kept", "dropped"),
    [
        (["The pro plan costs 30 EUR a month, billed yearly."],
         ["The pro plan costs 30 EUR a month, billed yearly."], 0),  # a line break collapsed
        (["  Free trial:\t14 days "], ["Free trial: 14 days"], 0),
        (["The basic plan costs 12 EUR a month."], [], 1),  # the page has **12 EUR**
        (["The enterprise plan costs 99 EUR."], [], 1),  # invented
        (["the pro plan costs 30 eur"], [], 1),  # case matters
        (["Cancel any time", "Free trial: 14 days"],
         ["Free trial: 14 days", "Cancel any time"], 0),  # page order
        (["costs 30 EUR", "The pro plan costs 30 EUR a month"],
         ["The pro plan costs 30 EUR a month"], 0),  # a passage inside another is said once
        (["Cancel any time", "Cancel any time"], ["Cancel any time"], 0),
        (["", "   ", 7, None, {"x": 1}], [], 3),
        ("not a list", [], 0),
        ([], [], 0),
    ],
)  # fmt: skip
def test_verbatim(passages: Any, kept: list[str], dropped: int) -> None:
    assert rules.verbatim(passages, PAGE) == (kept, dropped)


@pytest.mark.parametrize(
    ("text", "flat"),
    [("a\n\n b\t\tc", "a b c"), ("\u00a0x\u00a0 y ", "x y"), ("", ""), ("one", "one")],
)
def test_collapse(text: str, flat: str) -> None:
    assert rules.collapse(text) == flat
