# Search highlights (Firecrawl's `highlights`, on by default): a result's description becomes the
# passages of its page that match the query. Firecrawl asks a model for them; here they are picked
# with BM25 over the page's own passages, so no model is needed, the answer is the same for the
# same page, and every passage is verbatim text of the page (its markdown, cut only at block,
# sentence or word boundaries). Plain values in and out; the search service fetches the pages.
#
# Passages are the markdown's blocks (paragraphs, list items grouped, a fenced code block whole),
# longer ones cut into sentence runs. Words are lowercased \w+ runs; Chinese, Japanese and Korean
# text, written without spaces, is scored by character bigrams. A few English function words are
# not query terms, so "what is X" scores on X. Link targets do not count as text (a URL naming a
# query word is not a match), but stay in the passage as written.
from __future__ import annotations

import math
import re
from collections import Counter

MAX_PASSAGES = 3
"""Most passages in one highlight."""
MAX_CHARS = 700
"""Most characters of one highlight (its passages joined)."""
PASSAGE_CHARS = 350
"""A block longer than this is cut into runs of sentences of at most this length."""
MIN_WORDS = 4
"""A passage with fewer words (a heading, a lone link) is not a highlight on its own."""
FLOOR = 0.5
"""A passage scoring under this share of the best one is not added to it."""
MAX_PAGE_CHARS = 200_000
"""Only the start of a longer page is read (the scoring stays within milliseconds)."""
K1 = 1.2
B = 0.75

STOPWORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from", "has",
    "have", "how", "i", "in", "is", "it", "its", "of", "on", "or", "that", "the", "this", "to",
    "was", "what", "when", "where", "which", "who", "why", "will", "with", "you", "your",
})  # fmt: skip

_WORD = re.compile(r"\w+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")
_LINK_TARGET = re.compile(r"\]\([^)\s]*(?:\s+\"[^\"]*\")?\)")
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+")
_FENCE = re.compile(r"^\s*(```|~~~)")


def tokens(text: str) -> list[str]:
    """The scored terms of `text`: lowercased words without the stopwords, and CJK runs as
    character bigrams (a lone CJK character as itself)."""
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        start = 0
        for run in _CJK.finditer(word):
            out += _words(word[start : run.start()])
            chars = run.group(0)
            out += [chars] if len(chars) == 1 else [chars[i : i + 2] for i in range(len(chars) - 1)]
            start = run.end()
        out += _words(word[start:])
    return out


def _words(text: str) -> list[str]:
    return [text] if text and text not in STOPWORDS else []


def blocks(markdown: str) -> list[str]:
    """The markdown's blocks in page order: runs of lines between blank lines, a fenced code
    block kept whole (its blank lines included)."""
    out: list[str] = []
    current: list[str] = []
    fenced = False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        if not line.strip() and not fenced:
            if current:
                out.append("\n".join(current))
                current = []
            continue
        current.append(line)
    if current:
        out.append("\n".join(current))
    return [b.strip("\n") for b in out if b.strip()]


def _cut(block: str, limit: int) -> list[str]:
    """`block` as runs of whole sentences of at most `limit` characters, each a slice of it (so
    verbatim); a longer sentence is cut at the last space before the limit (or at the limit)."""
    if len(block) <= limit:
        return [block]
    ends = [m.start() for m in _SENTENCE_END.finditer(block)] + [len(block)]
    runs: list[str] = []
    start = 0
    while start < len(block):
        stop = max((e for e in ends if e <= start + limit), default=start)
        if stop <= start:  # one sentence longer than the limit
            space = block.rfind(" ", start, start + limit)
            stop = space if space > start + limit // 2 else start + limit
        run = block[start:stop].strip()
        if run:
            runs.append(run)
        start = stop
        while start < len(block) and block[start].isspace():
            start += 1
    return runs


def passages(markdown: str) -> list[str]:
    """The candidate passages of a page, in page order."""
    out: list[str] = []
    for block in blocks(markdown[:MAX_PAGE_CHARS]):
        out += block.splitlines() if _FENCE.match(block) is None and _is_list(block) else [block]
    return [cut for passage in out for cut in _cut(passage, PASSAGE_CHARS)]


def _is_list(block: str) -> bool:
    """A block of list items or table rows: each line is a passage of its own."""
    lines = block.splitlines()
    return len(lines) > 1 and all(ln.lstrip().startswith(("- ", "* ", "+ ", "|")) for ln in lines)


def scores(query_terms: list[str], docs: list[list[str]]) -> list[float]:
    """BM25 of each tokenized passage in `docs` for the query terms, the passages being the
    collection (idf from how many passages hold a term)."""
    if not docs:
        return []
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n or 1.0
    counts = [Counter(d) for d in docs]
    out = []
    for doc, tf in zip(docs, counts, strict=True):
        total = 0.0
        for term in query_terms:
            freq = tf.get(term, 0)
            if not freq:
                continue
            df = sum(1 for c in counts if term in c)
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            total += idf * freq * (K1 + 1) / (freq + K1 * (1 - B + B * len(doc) / avgdl))
        out.append(total)
    return out


def highlight(query: str, markdown: str) -> str | None:
    """The passages of `markdown` that best match `query` (at most MAX_PASSAGES, MAX_CHARS in
    all), in page order, joined by a blank line; None when no passage holds a query term."""
    terms = list(dict.fromkeys(tokens(query)))
    if not terms or not markdown.strip():
        return None
    candidates = []
    docs = []
    for passage in passages(markdown):
        text = _LINK_TARGET.sub("]", passage)
        if len(_WORD.findall(text)) >= MIN_WORDS:
            candidates.append(passage)
            docs.append(tokens(text))
    scored = scores(terms, docs)
    best = max(scored, default=0.0)
    ranked = sorted(
        ((score, i) for i, score in enumerate(scored) if score > 0 and score >= FLOOR * best),
        key=lambda pair: (-pair[0], pair[1]),
    )
    chosen: list[int] = []
    used = 0
    for _, i in ranked:
        size = len(candidates[i]) + (2 if chosen else 0)
        if used + size > MAX_CHARS:
            continue
        chosen.append(i)
        used += size
        if len(chosen) == MAX_PASSAGES:
            break
    if not chosen:
        return None
    return "\n\n".join(candidates[i] for i in sorted(chosen))
