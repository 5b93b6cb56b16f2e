# The rules of the `question`, `highlights` and `query` formats as pure functions over plain
# values, tested with tables: what a format object may hold (Firecrawl v2's strict shapes), what
# a job asks of the model per page (AskSpec), the instructions and schemas the model is given,
# and the check that keeps highlights honest.
#
# Firecrawl answers `question` (and `query` in "freeform" mode) with free text in `answer`, and
# `highlights` (and `query` in "directQuote" mode) with passages of the page picked by index from
# numbered sentences, joined into one string. crawld asks any OpenAI-compatible model for the
# passages themselves and keeps only those that are verbatim text of the page's markdown (after
# whitespace is collapsed): a passage the model reworded or invented is dropped and counted, so
# `highlights` never holds words the page does not have.
from __future__ import annotations

from typing import Any, Literal

import msgspec

from daemon.crawl.problems import Problem, problem
from daemon.llm import rules as llm_rules

FORMATS = frozenset({"question", "highlights", "query"})
TEXT_KEY = {"question": "question", "highlights": "query", "query": "prompt"}
"""The key holding what the model is asked, per format."""
KEYS = {name: frozenset({"type", key, "provider"}) for name, key in TEXT_KEY.items()}
KEYS["query"] = KEYS["query"] | {"mode"}
MODES = ("freeform", "directQuote")
SEPARATOR = "\n\n"
"""Between the passages of a highlights string (Firecrawl joins its blocks so)."""

ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
}
PASSAGES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"passages": {"type": "array", "items": {"type": "string"}}},
    "required": ["passages"],
}
ANSWER_PROMPT = (
    "Answer the question below about this page in `answer`. Use only what the page says; never "
    "add outside knowledge or guess. Be succinct: return exactly what is asked (a price, a name, "
    "a list), keeping the page's wording, units and code as they are. If the page does not say, "
    "answer briefly that it does not.\nQuestion: {text}"
)
PASSAGES_PROMPT = (
    "List in `passages` the passages of this page that answer the query below, each copied "
    "exactly as it is written on the page, character for character: no rewording, no "
    "summarising, no outside knowledge. Keep the page's order and do not repeat a fact. When no "
    "passage answers the query, give an empty list.\nQuery: {text}"
)


class AskSpec(msgspec.Struct, frozen=True):
    """One question a job asks the model of each of its pages."""

    field: Literal["answer", "highlights"]
    """The document field that gets the result."""
    verbatim: bool
    """Passages of the page (checked, joined) rather than a free answer."""
    text: str
    """The question, query or prompt."""
    provider: str | None = None


def check_format(fmt: str | dict[str, Any], name: str, where: str) -> list[Problem]:
    """Problems (400) of one `question`, `highlights` or `query` format (the format's own keys;
    whether an LLM is there is the caller's check)."""
    key = TEXT_KEY[name]
    if not isinstance(fmt, dict):
        shape = f'{{"type": "{name}", "{key}": "..."}}'
        return [problem(f"{where}.{key}", f"the {name} format needs `{key}`: send {shape}")]
    problems = [
        problem(f"{where}.{k}"[:200], "unrecognized key") for k in sorted(fmt)[:20]
        if k not in KEYS[name]
    ]  # fmt: skip
    text = fmt.get(key)
    if not isinstance(text, str) or not text.strip():
        problems.append(problem(f"{where}.{key}", "a non-empty string"))
    elif len(text) > llm_rules.MAX_PROMPT:
        problems.append(problem(f"{where}.{key}", f"at most {llm_rules.MAX_PROMPT} characters"))
    if name == "query" and fmt.get("mode", "freeform") not in MODES:
        problems.append(problem(f"{where}.mode", "'freeform' or 'directQuote'"))
    return problems


def repeated(formats: list[Any], path: str) -> list[Problem]:
    """A 400 for a second format filling the same field: `question` and `query` both fill
    `answer`, and one `highlights` is all a document holds."""
    problems, seen = [], set()
    for i, fmt in enumerate(formats):
        name = fmt if isinstance(fmt, str) else fmt.get("type") if isinstance(fmt, dict) else None
        if not isinstance(name, str) or name not in FORMATS:
            continue
        field = "highlights" if name == "highlights" else "answer"
        if field in seen:
            why = f"one format filling `{field}` per request (question or query: answer)"
            problems.append(problem(f"{path}.formats[{i}]", why))
        seen.add(field)
    return problems


def asks(formats: list[Any]) -> tuple[AskSpec, ...]:
    """What (already validated) formats ask of the model per page; () when nothing."""
    out = []
    for fmt in formats:
        if not isinstance(fmt, dict) or fmt.get("type") not in FORMATS:
            continue
        name = str(fmt["type"])
        verbatim = name == "highlights" or (name == "query" and fmt.get("mode") == "directQuote")
        field: Literal["answer", "highlights"] = "highlights" if name == "highlights" else "answer"
        out.append(AskSpec(field=field, verbatim=verbatim, text=str(fmt[TEXT_KEY[name]]),
                           provider=fmt.get("provider")))  # fmt: skip
    return tuple(out)


def instructions(spec: AskSpec) -> tuple[str, dict[str, Any]]:
    """(prompt, schema) of the call that answers `spec`."""
    if spec.verbatim:
        return PASSAGES_PROMPT.format(text=spec.text), PASSAGES_SCHEMA
    return ANSWER_PROMPT.format(text=spec.text), ANSWER_SCHEMA


def collapse(text: str) -> str:
    """`text` with every run of whitespace (newlines, tabs, NBSP) made one space, trimmed."""
    return " ".join(text.split())


def verbatim(passages: Any, page: str) -> tuple[list[str], int]:
    """(the passages that are text of `page`, whitespace collapsed, in page order, none inside
    another; how many the model proposed that are not on the page). A passage that is not a
    string counts as not on the page; an empty one is ignored."""
    flat = collapse(page)
    found: list[tuple[int, int, str]] = []
    dropped = 0
    for passage in passages if isinstance(passages, list) else []:
        text = collapse(passage) if isinstance(passage, str) else None
        if text == "":
            continue
        at = flat.find(text) if text is not None else -1
        if text is None or at < 0:
            dropped += 1
            continue
        found.append((at, at + len(text), text))
    kept: list[str] = []
    reach = -1
    for _start, end, text in sorted(found, key=lambda f: (f[0], -f[1])):
        if end <= reach:
            continue  # the same words as a passage already kept
        kept.append(text)
        reach = end
    return kept, dropped


def dropped_warning(field: str, dropped: int, proposed: int) -> str:
    return (
        f"{field}: {dropped} of the {proposed} passages the model proposed are not verbatim text "
        "of the page and were dropped."
    )
