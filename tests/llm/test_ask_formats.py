"""question / highlights / query on one document (daemon/crawl/llmwork/answers.py through
llm_formats.apply): what the model is sent, where its answer lands, what is dropped, and how a
failure becomes a warning with the page kept."""

from __future__ import annotations

from typing import Any

import pytest

from daemon.crawl.options import llm_formats
from daemon.crawl.problems import NO_LLM
from daemon.llm import LLM_RATE_LIMITED, LlmError, LlmResult, Usage

PAGE = "# Plans\n\nThe pro plan costs 30 EUR a month.\n\n- Free trial: 14 days\n- Cancel any time"


class ScriptedLlm:
    """Answers each call with the value scripted for its schema's property (`answer` or
    `passages`), or raises the scripted error."""

    def __init__(self, **values: Any) -> None:
        self.values = values
        self.calls: list[dict[str, Any]] = []

    def configured(self, provider: str | None = None) -> bool:
        return provider in (None, "default")

    async def extract_json(self, content: str, *, schema: Any, prompt: Any,
                           provider: Any = None) -> LlmResult:  # fmt: skip
        self.calls.append({"content": content, "schema": schema, "prompt": prompt,
                           "provider": provider})  # fmt: skip
        (key,) = schema["properties"]
        value = self.values[key]
        if isinstance(value, LlmError):
            raise value
        return LlmResult({key: value}, Usage(3, 2), False, "default", "m",
                         self.values.get("warning"))  # fmt: skip


async def run(formats: list[Any], llm: ScriptedLlm, markdown: str = PAGE) -> dict[str, Any]:
    plan = llm_formats.llm_plan(formats)
    assert plan is not None
    document: dict[str, Any] = {"markdown": markdown, "metadata": {}}
    await llm_formats.apply(llm, plan, document)
    return document


async def test_question_and_highlights_side_by_side() -> None:
    llm = ScriptedLlm(answer=" 30 EUR a month \n",
                      passages=["Cancel any time", "The pro plan costs 30 EUR a month."])  # fmt: skip
    document = await run([{"type": "question", "question": "How much?"},
                          {"type": "highlights", "query": "pro plan"}], llm)  # fmt: skip
    assert document == {
        "metadata": {}, "answer": "30 EUR a month",
        "highlights": "The pro plan costs 30 EUR a month.\n\nCancel any time",
    }  # fmt: skip
    prompts = sorted(c["prompt"] for c in llm.calls)
    assert prompts[0].endswith("Question: How much?") and prompts[1].endswith("Query: pro plan")
    assert all(c["content"] == PAGE for c in llm.calls)


async def test_invented_passages_are_dropped_and_said() -> None:
    llm = ScriptedLlm(passages=["Free trial: 14 days", "Free trial: 30 days", "Refunds: always"])
    document = await run(["markdown", {"type": "highlights", "query": "trial"}], llm)
    assert document["highlights"] == "Free trial: 14 days"
    assert document["markdown"] == PAGE
    assert document["warning"] == (
        "Highlights: 2 of the 3 passages the model proposed are not verbatim text of the page "
        "and were dropped."
    )


@pytest.mark.parametrize(
    ("fmt", "field", "verbatim"),
    [({"type": "query", "prompt": "cost?"}, "answer", False),
     ({"type": "query", "prompt": "cost?", "mode": "directQuote"}, "answer", True)],
)  # fmt: skip
async def test_query_maps_to_answer(fmt: dict[str, Any], field: str, verbatim: bool) -> None:
    llm = ScriptedLlm(answer="30 EUR", passages=["The pro plan costs 30 EUR a month.", "made up"])
    document = await run([fmt], llm)
    expected = "The pro plan costs 30 EUR a month." if verbatim else "30 EUR"
    assert document[field] == expected and "highlights" not in document
    assert ("warning" in document) is verbatim


async def test_failures_and_empty_pages_are_warnings() -> None:
    failing = ScriptedLlm(answer=LlmError(LLM_RATE_LIMITED, "rate limited (429)"), passages=[])
    document = await run([{"type": "question", "question": "q"},
                          {"type": "highlights", "query": "q"}], failing)  # fmt: skip
    assert "answer" not in document and document["highlights"] == ""
    assert document["warning"] == "Question failed: LLM_RATE_LIMITED: rate limited (429)"
    silent = ScriptedLlm(answer="x")
    empty = await run([{"type": "question", "question": "q"}], silent, markdown=" \n ")
    assert silent.calls == [] and empty["warning"] == "Question skipped: the page has no content."


async def test_unusable_answers_and_cut_pages() -> None:
    document = await run([{"type": "question", "question": "q"}], ScriptedLlm(answer=5))
    assert document["warning"] == (
        "Question failed: LLM_BAD_OUTPUT: the model's answer held no `answer` string"
    )
    cut = await run([{"type": "highlights", "query": "q"}],
                    ScriptedLlm(passages=["Cancel any time"], warning="The page was too long"))  # fmt: skip
    assert cut["highlights"] == "Cancel any time" and cut["warning"] == "The page was too long"


@pytest.mark.parametrize(
    ("fmt", "llm", "message"),
    [
        ({"type": "question", "question": "q"}, None, f"format 'question' needs an LLM: {NO_LLM}"),
        ({"type": "highlights", "query": "q"}, None, "format 'highlights' needs an LLM"),
        ({"type": "query", "prompt": "q"}, None, "format 'query' needs an LLM"),
        ({"type": "question", "question": "q", "provider": "b"}, ScriptedLlm(),
         "no [llm.providers] entry named 'b'"),
        ({"type": "question", "question": ""}, ScriptedLlm(), "a non-empty string"),
    ],
)  # fmt: skip
def test_check_format(fmt: dict[str, Any], llm: Any, message: str) -> None:
    problems = llm_formats.check_format(fmt, fmt["type"], "$.formats[0]", llm)
    assert any(message in p["message"] for p in problems), problems
    assert llm_formats.check_format(
        {"type": fmt["type"], rules_key(fmt["type"]): "q"}, fmt["type"], "$", ScriptedLlm()) == []  # fmt: skip


def rules_key(name: str) -> str:
    return {"question": "question", "highlights": "query", "query": "prompt"}[name]
