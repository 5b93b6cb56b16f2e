# The calls behind `question`, `highlights` and `query`: one structured call per format and page
# through the daemon's LlmService (daemon/llm/), so they share json's limits, retries, token
# accounting and answer cache (keyed by the prompt, which holds the question: another question
# is another call). A failure never fails the page: the document gets a warning instead of the
# field, as Firecrawl's "Query generation failed …" does.
from __future__ import annotations

from typing import Any

from daemon.crawl.llmwork.rules import (
    SEPARATOR,
    AskSpec,
    dropped_warning,
    instructions,
    verbatim,
)
from daemon.llm import LLM_BAD_OUTPUT, LlmError

WARNING_CHARS = 300
LABEL = {"answer": "Question", "highlights": "Highlights"}


async def ask(llm: Any, spec: AskSpec, markdown: str) -> tuple[str | None, list[str]]:
    """(the value of `spec.field`, or None; the warnings to add to the document). `markdown` is
    the page's, after onlyMainContent and include/exclude tags. Cancellation passes through."""
    label = LABEL[spec.field]
    if not markdown.strip():
        return None, [f"{label} skipped: the page has no content."]
    prompt, schema = instructions(spec)
    try:
        result = await llm.extract_json(
            markdown, schema=schema, prompt=prompt, provider=spec.provider
        )
        value = _value(spec, result.value, markdown)
    except LlmError as exc:
        return None, [f"{label} failed: {exc.code}: {exc.message}"[:WARNING_CHARS]]
    said = [result.warning] if result.warning else []
    text, dropped, proposed = value
    if dropped:
        said.append(dropped_warning(label, dropped, proposed))
    return text, said


def _value(spec: AskSpec, value: Any, markdown: str) -> tuple[str, int, int]:
    """(the field's text, passages dropped, passages proposed) of the model's answer."""
    if not spec.verbatim:
        answer = value.get("answer") if isinstance(value, dict) else None
        if not isinstance(answer, str):
            raise LlmError(LLM_BAD_OUTPUT, "the model's answer held no `answer` string")
        return answer.strip(), 0, 0
    passages = value.get("passages") if isinstance(value, dict) else None
    if not isinstance(passages, list):
        raise LlmError(LLM_BAD_OUTPUT, "the model's answer held no `passages` list")
    kept, dropped = verbatim(passages, markdown)
    return SEPARATOR.join(kept), dropped, len(passages)
