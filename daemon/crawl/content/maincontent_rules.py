# The rules that refine the extractor's choice of blocks (maincontent.py), as pure functions
# over lxml elements: what trafilatura keeps inside an article that is not the article ("Read
# more: <link>", newsletter and related boxes), what it drops that is (the heading of a table, a
# sign-off), and what html-to-markdown would write badly (twin emphasis). Each is a shape found
# on real pages of many sites and languages, not a site's class names; each has a literal-HTML
# test.
from __future__ import annotations

import itertools
import re
from collections.abc import Collection

from lxml import etree

INLINE_TAGS = frozenset(
    [
        "a",
        "abbr",
        "acronym",
        "b",
        "bdi",
        "bdo",
        "big",
        "br",
        "cite",
        "code",
        "data",
        "del",
        "dfn",
        "em",
        "font",
        "i",
        "img",
        "input",
        "ins",
        "kbd",
        "label",
        "mark",
        "q",
        "rp",
        "rt",
        "ruby",
        "s",
        "samp",
        "small",
        "span",
        "strike",
        "strong",
        "sub",
        "sup",
        "time",
        "tt",
        "u",
        "var",
        "wbr",
    ]
)
"""Tags whose text belongs to the enclosing block: a block is scored with its inline text."""

FILLED_TAGS = frozenset({"li", "dt", "dd", "td", "th", "pre"})
"""Blocks kept when they sit in the container of the extractor's blocks (see maincontent)."""
HEADING_TAGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
HEADED_TAGS = frozenset({"p", "td", "th", "pre", "dt", "dd"})
"""Blocks whose heading right above is content when they are (see `headings_above`)."""

ASIDE_WORDS = frozenset(
    {
        "newsletter", "subscribe", "related", "promo", "sponsored", "copyright", "credit",
        "credits", "sharing", "breadcrumb", "breadcrumbs", "donate", "donation",
    }
)  # fmt: skip
"""Class or id words (whole words of the attribute, split at any non-letter) of a box INSIDE the
content region that is not the content: a newsletter form, "related articles", a photo credit.
The extractor keeps such boxes when the page's own words for them are not the ones it knows."""

LABEL_WORDS = 4
"""A "Read more: <link>" block: at most this many words of label before the link (see
`see_also`)."""

EMPHASIS_TAGS = frozenset({"b", "strong", "i", "em", "u", "s", "del", "code"})
"""Adjacent twins of these are merged: html-to-markdown writes `**a****b**` for <b>a</b><b>b</b>."""


def is_inline(node: etree._Element) -> bool:
    return isinstance(node.tag, str) and node.tag in INLINE_TAGS


def own_text(node: etree._Element) -> str:
    """The text of `node` itself and of its inline descendants (not of nested blocks)."""
    parts = [node.text or ""]
    for child in node:
        if is_inline(child):
            parts.append(own_text(child))
        parts.append(child.tail or "")
    return " ".join(parts)


def link_density(node: etree._Element) -> float:
    text = len(own_text(node).strip())
    links = sum(len("".join(a.itertext()).strip()) for a in node.iter("a"))
    return links / text if text else 1.0


HIDING = etree.XPath("//*[@hidden or @style]")
_HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.I)


def hidden(node: etree._Element) -> bool:
    """Hidden the ways html-to-markdown drops (a copy of the article for a paywall's fade, say)."""
    style = node.get("style")
    return node.get("hidden") is not None or (
        style is not None and bool(_HIDDEN_STYLE.search(style))
    )


def _words(node: etree._Element) -> set[str]:
    value = f"{node.get('class') or ''} {node.get('id') or ''}".lower()
    return set(_NON_LETTER.split(value))


_NON_LETTER = re.compile(r"[^a-z]+")


def content_region(nodes: set[etree._Element]) -> etree._Element | None:
    """The lowest element that holds all of `nodes` (the content region)."""
    paths = [[*reversed(list(node.iterancestors())), node] for node in nodes]
    region = None
    for level in zip(*paths, strict=False):
        if any(other is not level[0] for other in level):
            break
        region = level[0]
    return region


def in_aside(
    node: etree._Element,
    region: etree._Element | None,
    seen: dict[etree._Element, bool] | None = None,
) -> bool:
    """Whether `node` sits in a box of the region with an ASIDE_WORDS class or id. `seen`, kept
    by the caller across the nodes of one region, remembers the answer for each element passed
    (kept blocks share most of their ancestors)."""
    ancestor: etree._Element | None = node
    passed = []
    found = False
    while ancestor is not None and ancestor is not region and ancestor.tag not in ("body", "html"):
        if seen is not None and ancestor in seen:
            found = seen[ancestor]
            break
        passed.append(ancestor)
        if _words(ancestor) & ASIDE_WORDS:
            found = True
            break
        ancestor = ancestor.getparent()
    if seen is not None:
        seen.update(dict.fromkeys(passed, found))
    return found


def _link_parts(node: etree._Element) -> tuple[str, int, int]:
    """(the own text before the first link, characters of link text, characters of own text)."""
    before: list[str] = []
    counts = [0, 0]
    seen_link = False

    def add(text: str | None, in_link: bool) -> None:
        if not text:
            return
        size = len(text.strip())
        counts[1] += size
        if in_link:
            counts[0] += size
        elif not seen_link:
            before.append(text)

    def walk(element: etree._Element, in_link: bool) -> None:
        nonlocal seen_link
        add(element.text, in_link)
        for child in element:
            if is_inline(child):
                if child.tag == "a":
                    seen_link = True
                walk(child, in_link or child.tag == "a")
            add(child.tail, in_link)

    walk(node, False)
    return " ".join(" ".join(before).split()), counts[0], counts[1]


def see_also(node: etree._Element) -> bool:
    """A "Read more: <link>" / "Lea también: <link>" block in running text: a short label ending
    in a colon, then a link that is at least half of the block's text. The label's words differ
    in every language and site; the shape does not."""
    if node.tag in FILLED_TAGS or node.find(".//a") is None:
        return False
    label, links, text = _link_parts(node)
    return (
        links >= 0.5 * text and label.endswith(":") and 0 < len(label[:-1].split()) <= LABEL_WORDS
    )


def sign_off(
    units: list[tuple[etree._Element, list[str]]],
    strong: set[etree._Element],
    short: Collection[etree._Element],
) -> list[etree._Element]:
    """The short block right after the extractor's last block, when the extractor's text has its
    words: a sign-off ("x Anna", "Yours, Hans"). Not a label that ends in a colon (what it
    introduces was left out) nor a link (the next page's title)."""
    last = max(i for i, (node, _) in enumerate(units) if node in strong)
    if last + 1 == len(units):
        return []
    node = units[last + 1][0]
    if node not in short or own_text(node).strip().endswith(":") or link_density(node) >= 0.5:
        return []
    return [node]


def headings_above(
    units: list[tuple[etree._Element, list[str]]], keep: set[etree._Element]
) -> list[etree._Element]:
    """Headings right above a kept paragraph, table cell or code block (the extractor drops the
    heading of a table, or one too short to match). Not above list items or other headings:
    measured, those are more often "More on this" over a list of teasers."""
    return [
        node
        for (node, tokens), (after, _) in itertools.pairwise(units)
        if node.tag in HEADING_TAGS
        and tokens
        and node not in keep
        and after in keep
        and after.tag in HEADED_TAGS
    ]


def merge_twins(node: etree._Element) -> None:
    """Merge adjacent twin emphasis elements with nothing between them, recursively."""
    child = node[0] if len(node) else None
    while child is not None:
        following = child.getnext()
        if (
            following is not None
            and isinstance(child.tag, str)
            and child.tag in EMPHASIS_TAGS
            and following.tag == child.tag
            and not (child.tail or "").strip()
            and dict(child.attrib) == dict(following.attrib)
        ):
            last = child[-1] if len(child) else None
            gap = child.tail or ""
            if last is not None:
                last.tail = (last.tail or "") + gap + (following.text or "")
            else:
                child.text = (child.text or "") + gap + (following.text or "")
            child.extend(list(following))
            child.tail = following.tail
            node.remove(following)
            continue
        merge_twins(child)
        child = following
