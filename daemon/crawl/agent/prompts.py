# What the agent asks the model, and how its answers are read, as plain values. Two structured
# calls exist: a choice (which of the shown candidates to read next: the model may only pick
# URLs it was shown, anything else is dropped) and the answer (the request's schema, or a free
# `answer` string, with the sources it came from: only URLs of pages the model was given count;
# when the model names none of them, the sources are the pages whose text holds the answer's
# values, else every page it was given). The page content goes after "Page content:" in the
# LLM service's messages (daemon/llm/rules.py), the task in its instructions.
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from daemon.llm.rules import CHARS_PER_TOKEN

MAX_QUERY = 400
"""Most characters of the prompt sent to the search provider."""
EXCERPT = 300
"""Characters of each page read that a choice shows."""
SNIPPET = 200
ANSWER_KEY = "answer"
_WORD = re.compile(r"[^\W_]{3,}", re.UNICODE)
_STOP = frozenset(
    ["the", "and", "for", "with", "from", "that", "this", "what", "which", "who", "whom", "whose",
     "are", "was", "were", "have", "has", "had", "find", "list", "give", "get", "all", "any",
     "each", "their", "there", "about", "into", "over", "than", "then", "them", "they", "you",
     "your", "please", "extract", "page", "pages", "site", "website"]
)  # fmt: skip
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Candidate:
    """A URL the agent may read: a search result, or a link of a page read."""

    url: str
    title: str = ""
    snippet: str = ""


@dataclass(frozen=True)
class PageText:
    """A page read, as the answer is given it."""

    url: str
    title: str
    text: str


def one_line(text: str, limit: int) -> str:
    line = _SPACE.sub(" ", text).strip()
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def search_query(prompt: str) -> str:
    """The prompt on one line, cut at a word boundary to MAX_QUERY characters."""
    line = _SPACE.sub(" ", prompt).strip()
    if len(line) <= MAX_QUERY:
        return line
    cut = line[:MAX_QUERY]
    space = cut.rfind(" ")
    return cut[:space] if space > MAX_QUERY // 2 else cut


def terms(prompt: str) -> frozenset[str]:
    """The prompt's words that say what it is about (lower case, 3+ letters, no stop words)."""
    return frozenset(w for w in _WORD.findall(prompt.lower()) if w not in _STOP)


def ranked(candidates: list[Candidate], prompt: str, limit: int) -> list[Candidate]:
    """The `limit` candidates most worth showing: those sharing most words with the prompt (in
    URL, title and snippet) first, ties in the order they were found."""
    wanted = terms(prompt)

    def score(c: Candidate) -> int:
        found = set(_WORD.findall(f"{c.url} {c.title} {c.snippet}".lower()))
        return len(wanted & found)

    order = sorted(range(len(candidates)), key=lambda i: (-score(candidates[i]), i))
    return [candidates[i] for i in order[:limit]]


CHOICE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "read": {
            "type": "array",
            "items": {"type": "string"},
            "description": "URLs of candidates to read next, most useful first",
        }
    },
    "required": ["read"],
    "additionalProperties": False,
}


def choice_instruction(prompt: str, most: int) -> str:
    return (
        "You gather information on the web for this task:\n"
        f"{prompt}\n\n"
        f"Choose at most {most} of the candidate URLs below to read next, the most useful first,"
        " copying each URL exactly as listed. Choose none when the pages read so far are enough"
        " to do the task."
    )


def choice_content(read: list[PageText], shown: list[Candidate]) -> str:
    """The pages read so far (URL, title, an excerpt) and the candidates, one per `- ` line."""
    lines = ["Pages read so far:"]
    if not read:
        lines.append("(none)")
    for i, page in enumerate(read, 1):
        lines.append(f"[{i}] {page.url} — {one_line(page.title, 120) or '(no title)'}")
        lines.append(f"    Excerpt: {one_line(page.text, EXCERPT)}")
    lines += ["", "Candidates (not read yet):"]
    for c in shown:
        about = one_line(" ".join(p for p in (c.title, c.snippet) if p), SNIPPET)
        lines.append(f"- {c.url}" + (f" — {about}" if about else ""))
    return "\n".join(lines)


def chosen_urls(value: Any, shown: list[Candidate], most: int) -> list[str]:
    """The shown candidates the model picked, in its order, each once, at most `most`: an
    entry counts when it is a shown URL or starts with one (a copied candidate line)."""
    picks = value.get("read") if isinstance(value, dict) else None
    if not isinstance(picks, list):
        return []
    urls = [c.url for c in shown]
    known = set(urls)
    by_length = sorted(urls, key=len, reverse=True)
    out: list[str] = []
    for pick in picks:
        if not isinstance(pick, str):
            continue
        text = pick.strip().lstrip("-*• ").strip().strip("<>")
        url = text if text in known else next((u for u in by_length if text.startswith(u)), None)
        if url is not None and url not in out:
            out.append(url)
        if len(out) >= most:
            break
    return out


def answer_schema(schema: dict[str, Any] | None) -> dict[str, Any]:
    """The answer call's schema: `data` (the request's schema, or an object with a free
    `answer`) and the `sources` it came from."""
    data = schema or {
        "type": "object",
        "properties": {ANSWER_KEY: {"type": "string"}},
        "required": [ANSWER_KEY],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {
            "data": data,
            "sources": {
                "type": "array",
                "items": {"type": "string"},
                "description": "URLs of the sources the answer came from",
            },
        },
        "required": ["data", "sources"],
        "additionalProperties": False,
    }


def answer_instruction(prompt: str, schema: bool) -> str:
    shape = "following the schema" if schema else f"as text in `{ANSWER_KEY}`"
    return (
        "Do this task using only the sources below:\n"
        f"{prompt}\n\n"
        f"Put the result in `data` {shape}; use null (or an empty list) for what the sources do"
        " not say. List in `sources` the URLs of the sources the result came from, copied from"
        " their `Source:` lines."
    )


def answer_content(pages: list[PageText], budget_chars: int) -> str:
    """Each page as a `Source:` block, its text cut to a fair share of `budget_chars`."""
    if not pages:
        return ""
    share = max(200, budget_chars // len(pages))
    blocks = []
    for page in pages:
        text = page.text if len(page.text) <= share else page.text[:share].rstrip() + " …"
        title = one_line(page.title, 200) or "(no title)"
        blocks.append(f"## {title}\nSource: {page.url}\n\n{text.strip()}")
    return "\n\n---\n\n".join(blocks)


def tokens_of(chars: int) -> int:
    return int(chars / CHARS_PER_TOKEN) + 1


@dataclass(frozen=True)
class Answer:
    data: Any
    sources: list[str]


def read_answer(value: Any, pages: list[PageText]) -> Answer:
    """The answer's `data` and its sources: the page URLs the model named (in its order),
    else the pages holding the answer's text values, else every page it was given."""
    data = value.get("data") if isinstance(value, dict) else None
    named = value.get("sources") if isinstance(value, dict) else None
    urls = [p.url for p in pages]
    sources: list[str] = []
    for item in named if isinstance(named, list) else []:
        url = item.strip() if isinstance(item, str) else None
        if url in urls and url not in sources:
            sources.append(url)
    if not sources:
        sources = evidence(data, pages) or urls
    return Answer(data, sources)


def evidence(data: Any, pages: list[PageText]) -> list[str]:
    """The pages whose text holds one of `data`'s string values (4+ characters, compared
    case-insensitively with spaces collapsed), in page order."""
    values = [v for v in _strings(data) if len(v) >= 4]
    if not values:
        return []
    out = []
    for page in pages:
        text = _SPACE.sub(" ", f"{page.title} {page.text}").lower()
        if any(v in text for v in values):
            out.append(page.url)
    return out


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [_SPACE.sub(" ", value).strip().lower()]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []
