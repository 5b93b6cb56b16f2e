# A document's pages put together as Firecrawl answers them: the markdown (pages joined by a blank
# line, or with `pageMarkers` by "\n\n---\n\n<!-- page N -->\n\n" between pages only, N the
# 1-based physical page that follows), `data.pages`, numPages / totalPages, and the warning that
# names pages left without text. Pure functions, tested with tables.
from __future__ import annotations

from typing import Any

__all__ = ["join_pages", "page_list", "page_ranges"]


def join_pages(pages: list[str], *, markers: bool) -> str:
    """The document's markdown from its pages' (page 1 first); pages without text are left out,
    so marker numbers skip them."""
    kept = [(number, text.strip()) for number, text in enumerate(pages, 1) if text.strip()]
    if not markers:
        return "\n\n".join(text for _, text in kept)
    parts = []
    for i, (number, text) in enumerate(kept):
        parts.append(text if i == 0 else f"\n\n---\n\n<!-- page {number} -->\n\n{text}")
    return "".join(parts)


def page_list(pages: list[str]) -> list[dict[str, Any]]:
    """`data.pages`: every page read, text or not."""
    return [{"pageNumber": n, "markdown": text.strip()} for n, text in enumerate(pages, 1)]


def page_ranges(indexes: list[int]) -> str:
    """0-based page indexes as 1-based ranges for people: [0, 1, 2, 5] → "1-3, 6"."""
    out: list[str] = []
    numbers = sorted(i + 1 for i in indexes)
    start = prev = None
    for n in [*numbers, None]:
        if n is not None and prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    return ", ".join(out)
