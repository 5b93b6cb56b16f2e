"""The crawl side of the LLM formats (daemon/crawl/options/llm_formats.py): the plan read from a request's
formats, the request checks, and how a document gets its json/summary and warnings."""

from __future__ import annotations

from typing import Any

import pytest

from daemon.crawl.options import llm_formats
from daemon.llm import LLM_TIMEOUT, LlmError, LlmResult, Usage


class FakeLlm:
    def __init__(self, *, fail: str | None = None, warning: str | None = None,
                 providers: tuple[str, ...] = ("default",)) -> None:  # fmt: skip
        self.fail, self.warning, self.providers = fail, warning, providers
        self.calls: list[tuple[str, str, Any]] = []

    def configured(self, provider: str | None = None) -> bool:
        return (provider or "default") in self.providers

    async def extract_json(self, content: str, *, schema: Any, prompt: Any,
                           provider: Any = None) -> LlmResult:  # fmt: skip
        self.calls.append(("json", content, provider))
        if self.fail == "json":
            raise LlmError(LLM_TIMEOUT, "no answer within 1s (after 2 attempts)")
        return LlmResult({"len": len(content)}, Usage(1, 1), False, "default", "m", self.warning)

    async def summarize(self, content: str, *, provider: Any = None) -> LlmResult:
        self.calls.append(("summary", content, provider))
        if self.fail == "summary":
            raise LlmError(LLM_TIMEOUT, "no answer")
        return LlmResult("short", Usage(1, 1), False, "default", "m", self.warning)


def test_plan() -> None:
    assert llm_formats.llm_plan(["markdown", "links"]) is None
    plan = llm_formats.llm_plan(["summary", {"type": "json", "prompt": "p", "provider": "x"}])
    assert plan is not None and plan.summary and not plan.keep_markdown
    assert plan.json == llm_formats.JsonSpec(schema=None, prompt="p", provider="x")
    kept = llm_formats.llm_plan(["markdown", {"type": "summary"}])
    assert kept is not None and kept.keep_markdown and kept.json is None


async def test_apply_fills_the_document_and_drops_unasked_markdown() -> None:
    llm = FakeLlm()
    plan = llm_formats.llm_plan([{"type": "json"}, "summary"])
    assert plan is not None
    document: dict[str, Any] = {"markdown": "# Hello", "metadata": {}}
    await llm_formats.apply(llm, plan, document)
    assert document == {"metadata": {}, "json": {"len": 7}, "summary": "short"}
    assert sorted(c[0] for c in llm.calls) == ["json", "summary"]
    assert all(c[1] == "# Hello" for c in llm.calls)


async def test_a_failure_is_a_warning_and_the_page_stays() -> None:
    plan = llm_formats.llm_plan(["markdown", {"type": "json"}, "summary"])
    assert plan is not None
    document: dict[str, Any] = {"markdown": "# Hello", "warning": "earlier"}
    await llm_formats.apply(FakeLlm(fail="json"), plan, document)
    assert "json" not in document and document["summary"] == "short"
    assert document["markdown"] == "# Hello"
    assert document["warning"] == (
        "earlier JSON extraction failed: LLM_TIMEOUT: no answer within 1s (after 2 attempts)"
    )


async def test_cut_content_warns_once() -> None:
    plan = llm_formats.llm_plan([{"type": "json"}, "summary"])
    assert plan is not None
    document: dict[str, Any] = {"markdown": "x" * 10}
    await llm_formats.apply(FakeLlm(warning="The page was too long"), plan, document)
    assert document["warning"] == "The page was too long"


async def test_empty_page_gets_no_summary_call() -> None:
    llm = FakeLlm()
    plan = llm_formats.llm_plan(["summary"])
    assert plan is not None
    document: dict[str, Any] = {"markdown": "  "}
    await llm_formats.apply(llm, plan, document)
    assert llm.calls == [] and "summary" not in document
    assert document["warning"] == "Summary skipped: the page has no content."


@pytest.mark.parametrize(
    ("fmt", "llm", "problem"),
    [
        ({"type": "json"}, None, "needs an LLM"),
        ({"type": "json"}, FakeLlm(providers=()), "needs an LLM"),
        ({"type": "json", "provider": "b"}, FakeLlm(), "no [llm.providers] entry named 'b'"),
        ({"type": "json", "provider": "b"}, FakeLlm(providers=("default", "b")), None),
        ({"type": "json", "prompt": 5}, FakeLlm(), "must be a string"),
        ({"type": "json", "checkPromptInjection": "yes"}, FakeLlm(), "must be a boolean"),
        ({"type": "summary", "schema": {}}, FakeLlm(), "unrecognized key"),
        ("summary", FakeLlm(), None),
    ],
)
def test_check_format(fmt: Any, llm: Any, problem: str | None) -> None:
    name = fmt if isinstance(fmt, str) else fmt["type"]
    problems = llm_formats.check_format(fmt, name, "$.formats[0]", llm)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p["message"] for p in problems), problems
