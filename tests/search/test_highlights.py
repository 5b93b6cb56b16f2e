"""Search highlights with plain values: the terms, the passages of a page, and which of them
match a query (daemon/search/highlights.py). Every highlight must be verbatim text of the page."""

from __future__ import annotations

import pytest

from daemon.search.highlights import (
    MAX_CHARS,
    MAX_PASSAGES,
    PASSAGE_CHARS,
    blocks,
    highlight,
    passages,
    scores,
    tokens,
)

PAGE = """# Trio nurseries

A nursery is the place where tasks live: it waits for all of them before it exits.

Cancel scopes bound the time an operation may take, and nest.

- [Nurseries](https://trio.readthedocs.io/en/stable/reference-core.html#nurseries)
- [Cancellation](https://example.org/cancel) and timeouts in short

```python
async with trio.open_nursery() as nursery:

    nursery.start_soon(child)
```

Memory channels carry values between tasks; a channel closes when every clone is closed.
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What is a Trio nursery?", ["trio", "nursery"]),
        ("cancel-scope  TIMEOUT_s", ["cancel", "scope", "timeout_s"]),
        ("東京タワー", ["東京", "京タ", "タワ", "ワー"]),
        ("python 3.12 と東", ["python", "3", "12", "と東"]),
        ("the of and", []),
        ("", []),
    ],
)
def test_tokens(text: str, expected: list[str]) -> None:
    assert tokens(text) == expected


def test_blocks_keep_a_fenced_code_block_whole() -> None:
    found = blocks(PAGE)
    assert found[0] == "# Trio nurseries"
    assert any(b.startswith("```python") and b.endswith("```") and "\n\n" in b for b in found)
    assert blocks("\n\n  \n") == []


@pytest.mark.parametrize(
    ("markdown", "count", "longest"),
    [
        ("one short line", 1, 14),
        ("- item one here\n- item two here", 2, 15),  # list items are passages of their own
        ("| a | b |\n| 1 | 2 |", 2, 9),
        (" ".join(["A sentence of some words."] * 40), 4, PASSAGE_CHARS),  # cut by sentences
        ("\n  ".join(["A sentence of some words."] * 40), 4, PASSAGE_CHARS),
        ("x" * 1000, 3, PASSAGE_CHARS),  # no space at all: cut at the limit
    ],
)
def test_passages_are_bounded(markdown: str, count: int, longest: int) -> None:
    found = passages(markdown)
    assert len(found) == count
    assert max(len(p) for p in found) <= longest
    assert all(p in markdown for p in found)  # verbatim pieces of the page


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (
            "what does a nursery wait for",
            "A nursery is the place where tasks live: it waits for all of them before it exits.",
        ),
        ("cancel scope time", "Cancel scopes bound the time an operation may take, and nest."),
        (
            "channel closes",
            "Memory channels carry values between tasks; a channel closes when every clone is"
            " closed.",
        ),
        (
            "start_soon",
            "async with trio.open_nursery() as nursery:\n\n    nursery.start_soon(child)",
        ),
    ],
)
def test_the_best_passage_is_chosen(query: str, expected: str) -> None:
    found = highlight(query, PAGE)
    assert found is not None and expected in found
    for passage in found.split("\n\n"):
        assert passage in PAGE


@pytest.mark.parametrize(
    ("query", "markdown"),
    [
        ("quantum chromodynamics", PAGE),  # nothing matches: the snippet stays
        ("the of and", PAGE),  # only stopwords
        ("readthedocs", PAGE),  # a word only in a link target is not text
        ("nurseries", "# Trio nurseries"),  # a heading alone is too short to be a highlight
        ("anything", ""),
    ],
)
def test_no_highlight(query: str, markdown: str) -> None:
    assert highlight(query, markdown) is None


def test_passages_come_in_page_order_within_the_bounds() -> None:
    page = "\n\n".join(
        f"Paragraph {i} talks about widgets and gadgets at length." for i in range(9)
    )
    page += "\n\nThe last paragraph talks about widgets, gadgets and widget gadgets."
    found = highlight("widgets gadgets", page)
    assert found is not None
    parts = found.split("\n\n")
    assert len(parts) <= MAX_PASSAGES and len(found) <= MAX_CHARS
    assert parts == sorted(parts, key=page.index)
    assert "The last paragraph" in found  # the best one is among them


def test_a_weak_match_is_not_added_to_a_strong_one() -> None:
    page = (
        "Widgets are sold here to anyone who asks nicely.\n\n"
        "Gadget widgets: the gadget widget catalogue lists every gadget widget."
    )
    assert highlight("gadget widget catalogue", page) == (
        "Gadget widgets: the gadget widget catalogue lists every gadget widget."
    )


@pytest.mark.parametrize(
    ("docs", "ranking"),
    [
        ([["a", "b"], ["a"], ["c"]], [1, 0, 2]),  # shorter passage with the term first
        ([["a", "a", "x"], ["a", "x", "y"]], [0, 1]),  # more occurrences first
        ([["rare", "x"], ["common", "x"], ["common", "y"]], [0, 1, 2]),  # rarer term weighs more
    ],
)
def test_bm25_orders(docs: list[list[str]], ranking: list[int]) -> None:
    terms = ["a"] if docs[0][0] == "a" else ["rare", "common"]
    found = scores(terms, docs)
    assert sorted(range(len(docs)), key=lambda i: (-found[i], i)) == ranking
    assert scores(["a"], []) == []
