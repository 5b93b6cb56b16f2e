# The formats of the crawl API (Firecrawl v2) a model answers, on every path that scrapes: `json`
# and `summary` here, `question` / `highlights` / `query` with the rules and calls of their room
# (daemon/crawl/llmwork/). The request's formats are checked here (Firecrawl's 400s for a bad
# schema or unknown keys; the "needs an LLM" 400 only when `[llm]` is absent), and a produced
# page gets its fields here, from its markdown, through the daemon's LlmService (daemon/llm/),
# before the page's document and event commit. A failed call never fails the page: the document
# carries a warning ("JSON extraction failed: …") and not the field, as Firecrawl's newest
# server does.
#
# crawld's extension: a format object may name a provider of `[llm.providers]` ("provider").
from __future__ import annotations

from typing import Any, Protocol

import msgspec
import trio

from daemon.crawl.llmwork import answers
from daemon.crawl.llmwork import rules as ask_rules
from daemon.crawl.llmwork.rules import AskSpec
from daemon.crawl.problems import needs_llm, problem
from daemon.llm import LlmError
from daemon.llm import rules as llm_rules

JSON_KEYS = frozenset({"type", "schema", "prompt", "checkPromptInjection", "provider"})
SUMMARY_KEYS = frozenset({"type", "provider"})
SERVED = frozenset({"json", "summary"}) | ask_rules.FORMATS
WARNING_CHARS = 300


class LlmCheck(Protocol):
    def configured(self, provider: str | None = None) -> bool: ...


class JsonSpec(msgspec.Struct, frozen=True):
    schema: dict[str, Any] | None = None
    prompt: str | None = None
    provider: str | None = None


class LlmPlan(msgspec.Struct, frozen=True):
    """The LLM formats a job's pages get, computed once per job from its validated formats."""

    json: JsonSpec | None = None
    summary: bool = False
    summary_provider: str | None = None
    asks: tuple[AskSpec, ...] = ()
    """question / highlights / query."""
    keep_markdown: bool = True
    """Whether `markdown` was asked for (else it is dropped after the model read it)."""


def check_format(
    fmt: str | dict[str, Any], name: str, where: str, llm: LlmCheck | None
) -> list[dict[str, Any]]:
    """Problems (400) of one format of SERVED. A json format's schema is replaced by its
    normalised form (Firecrawl's), which is what the job stores."""
    if llm is None or not llm.configured():
        return [problem(where, needs_llm(f"format {name!r}"))]
    if name in ask_rules.FORMATS:
        return ask_rules.check_format(fmt, name, where) + _provider_problems(fmt, where, llm)
    if not isinstance(fmt, dict):
        return []
    problems = [
        problem(f"{where}.{key}"[:200], "unrecognized key")
        for key in sorted(fmt)[:20]
        if key not in (JSON_KEYS if name == "json" else SUMMARY_KEYS)
    ]
    problems += _provider_problems(fmt, where, llm)
    if name != "json":
        return problems
    prompt = fmt.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        problems.append(problem(f"{where}.prompt", "must be a string"))
    elif prompt is not None and len(prompt) > llm_rules.MAX_PROMPT:
        problems.append(problem(f"{where}.prompt", f"at most {llm_rules.MAX_PROMPT} characters"))
    flag = fmt.get("checkPromptInjection")
    if flag is not None and not isinstance(flag, bool):
        problems.append(problem(f"{where}.checkPromptInjection", "must be a boolean"))
    if fmt.get("schema") is not None:
        normalized, found = llm_rules.checked_schema(fmt["schema"])
        if found is not None:
            problems.append(problem(f"{where}.schema", found))
        else:
            fmt["schema"] = normalized
    return problems


def _provider_problems(
    fmt: str | dict[str, Any], where: str, llm: LlmCheck
) -> list[dict[str, Any]]:
    provider = fmt.get("provider") if isinstance(fmt, dict) else None
    if provider is not None and (not isinstance(provider, str) or not llm.configured(provider)):
        return [
            problem(f"{where}.provider", f"no [llm.providers] entry named {str(provider)[:64]!r}")
        ]
    return []


def llm_plan(formats: list[str | dict[str, Any]]) -> LlmPlan | None:
    """What a job's (already validated) formats ask of the model; None: nothing."""
    spec: JsonSpec | None = None
    summary, summary_provider, markdown = False, None, False
    for fmt in formats:
        name = fmt if isinstance(fmt, str) else fmt.get("type")
        options = fmt if isinstance(fmt, dict) else {}
        if name == "json":
            spec = JsonSpec(
                schema=options.get("schema"),
                prompt=options.get("prompt"),
                provider=options.get("provider"),
            )
        elif name == "summary":
            summary, summary_provider = True, options.get("provider")
        elif name == "markdown":
            markdown = True
    asks = ask_rules.asks(formats)
    if spec is None and not summary and not asks:
        return None
    return LlmPlan(
        json=spec,
        summary=summary,
        summary_provider=summary_provider,
        asks=asks,
        keep_markdown=markdown,
    )


def _warn(document: dict[str, Any], text: str) -> None:
    existing = document.get("warning")
    document["warning"] = f"{existing} {text}" if existing else text


async def apply(llm: Any, plan: LlmPlan, document: dict[str, Any]) -> None:
    """Give `document` its `json`, `summary`, `answer` and `highlights` from its markdown (the
    calls run side by side); a failure becomes a warning on the document. Cancellation passes
    through."""
    content = document.get("markdown") or ""
    results: dict[str, Any] = {}
    said: dict[str, list[str]] = {"json": [], "summary": [], "answer": [], "highlights": []}

    async def run_json(spec: JsonSpec) -> None:
        try:
            result = await llm.extract_json(
                content, schema=spec.schema, prompt=spec.prompt, provider=spec.provider
            )
        except LlmError as exc:
            said["json"].append(
                f"JSON extraction failed: {exc.code}: {exc.message}"[:WARNING_CHARS]
            )
            return
        results["json"] = result.value
        if result.warning:
            said["json"].append(result.warning)

    async def run_summary() -> None:
        if not content.strip():
            said["summary"].append("Summary skipped: the page has no content.")
            return
        try:
            result = await llm.summarize(content, provider=plan.summary_provider)
        except LlmError as exc:
            said["summary"].append(f"Summary failed: {exc.code}: {exc.message}"[:WARNING_CHARS])
            return
        results["summary"] = result.value
        if result.warning:
            said["summary"].append(result.warning)

    async def run_ask(spec: AskSpec) -> None:
        value, warnings = await answers.ask(llm, spec, content)
        if value is not None:
            results[spec.field] = value
        said[spec.field] += warnings

    async with trio.open_nursery() as nursery:
        if plan.json is not None:
            nursery.start_soon(run_json, plan.json)
        if plan.summary:
            nursery.start_soon(run_summary)
        for spec in plan.asks:
            nursery.start_soon(run_ask, spec)
    for field in said:  # json, summary, answer, highlights: in that order in the document
        if field in results:
            document[field] = results[field]
    if not plan.keep_markdown:
        document.pop("markdown", None)
    for text in dict.fromkeys(t for texts in said.values() for t in texts):  # each text once
        _warn(document, text)
