# `onlyMainContent` as a content extractor (issue 24). Firecrawl's selector blacklist keeps
# comment threads and teaser lists whose class names it does not know, and drops articles that a
# template wraps in a `.widget`; a scoring extractor does neither. trafilatura (Apache-2.0) scores
# the page's blocks (text and link density, tag and class evidence, comments, position) better
# than hand-written rules here measured, but its output is a text or a rebuilt tree that loses
# code languages, figures and attributes. So trafilatura only DECIDES: its text is the oracle of
# which of the page's own blocks are content, and the page's own markup of those blocks goes on
# to html-to-markdown as before (headings, lists, tables, fenced code with its language, links,
# images). Pure functions over an html string; the caller runs them in a worker thread.
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

import lxml.html
from lxml import etree
from selectolax.lexbor import LexborHTMLParser, LexborNode

from daemon.crawl.content.maincontent_rules import (
    FILLED_TAGS,
    HEADING_TAGS,
    HIDING,
    INLINE_TAGS,
    LABEL_WORDS,
    content_region,
    headings_above,
    hidden,
    in_aside,
    is_inline,
    link_density,
    merge_twins,
    own_text,
    see_also,
    sign_off,
)

MEDIA_TAGS = frozenset({"img", "picture", "video", "audio", "svg", "source", "figure"})
"""Kept without text of their own when they sit between content blocks."""

SHINGLE = 3
"""Blocks of at least this many words are matched by word 3-grams; shorter ones by position."""

KEEP_SHARE = 0.5
"""Share of a block's 3-grams found in the extractor's text for the block to be content."""

FILL_DEPTH = 4
"""How far up (li → ul → container, td → tr → tbody → table → container) that container is."""

MIN_TEXT = 100
"""An extraction with less text than this (characters) is not convincing: the caller falls back."""

_PARSER = etree.HTMLParser(remove_comments=True, remove_pis=True)
"""Plain lxml elements (no lxml.html class lookup per element: a tenth of the time here)."""

_ORACLE_PARSER = etree.HTMLParser(
    collect_ids=False, default_doctype=False, encoding="utf-8", remove_comments=True,
    remove_pis=True,
)  # fmt: skip
_ORACLE_PARSER.set_element_class_lookup(
    etree.ElementDefaultClassLookup(
        element=lxml.html.HtmlElement,
        comment=lxml.html.HtmlComment,
        pi=lxml.html.HtmlProcessingInstruction,
        entity=lxml.html.HtmlEntity,
    )
)
"""trafilatura's own parser settings (trafilatura.utils.HTML_PARSER), but every element an
lxml.html HtmlElement chosen in C: lxml.html's class lookup calls Python for each element of
every copy trafilatura makes (a tenth of its time); it uses no form or input element class."""

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_WORD = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")
"""Words; each CJK character is one (those scripts do not separate words with spaces)."""


BOILERPLATE_HINTS = (
    "header, footer, nav, aside, form, dialog, [role=navigation], [role=banner], "
    "[role=contentinfo], [role=complementary]"
    + "".join(
        f", [class*={w} i], [id*={w} i]"
        for w in (
            "nav", "menu", "header", "footer", "sidebar", "widget", "comment", "related",
            "share", "social", "teaser", "promo", "newsletter", "subscribe", "trending",
            "recommend", "cookie", "consent", "banner", "breadcrumb", "advert", "sponsor",
        )
    )
)  # fmt: skip
"""Any of these on a page and the extractor runs; without any, a page is all content."""

NOT_CONTENT = "iframe, input, select, textarea"
"""Never main content (html-to-markdown would write an embedded video as an `[iframe](…)` line)."""

MAIN_SHARE = 0.6
"""Share of the page's text a plain <main>/<article> must hold to be taken as the content."""

PLAIN_LINK_SHARE = 0.3
"""At most this share of a plain page's text is link text (more: a listing, not content)."""


def _plain(node: LexborNode) -> bool:
    if node.css_first(BOILERPLATE_HINTS) is not None:
        return False
    text = len(node.text(strip=True))
    links = sum(len(a.text(strip=True)) for a in node.css("a"))
    return text > 0 and links <= PLAIN_LINK_SHARE * text


def is_plain_page(tree: LexborHTMLParser) -> bool:
    """A page without any boilerplate hint (BOILERPLATE_HINTS) and with little link text: a
    README, a generated document, a bare article. It is all content, kept whole: an extractor
    could only lose some of it (a closing list of links, a short paragraph)."""
    return tree.body is not None and _plain(tree.body)


def plain_main_element(tree: LexborHTMLParser) -> LexborNode | None:
    """The page's one outermost <main>, <article> or role=main element when it holds most of
    the page's text (MAIN_SHARE) and is itself plain (no boilerplate hint inside, little link
    text, no "Read more: <link>" paragraph, no figure caption): the page says where its content
    is and nothing inside it needs scoring."""
    found = [
        node
        for node in tree.css("main, article, [role=main]")
        if not any(
            parent.tag in ("main", "article") or parent.attributes.get("role") == "main"
            for parent in _ancestors(node)
        )
    ]
    if len(found) != 1 or tree.body is None:
        return None
    element = found[0]
    page_text = len(tree.body.text(strip=True))
    if len(element.text(strip=True)) < MAIN_SHARE * page_text or not _plain(element):
        return None
    if element.css_first("figcaption") is not None:
        return None  # captions and their credits: the extractor judges them, block by block
    if any(_labelled_link(block) for block in element.css("p")):
        return None  # a "Read more: <link>" inside: the extractor's rules drop it (`see_also`)
    return element


def _labelled_link(block: LexborNode) -> bool:
    """`see_also` on a selectolax block: a short label with a colon, then mostly link."""
    link = block.css_first("a")
    if link is None:
        return False
    text = block.text()
    label = text[: text.find(link.text())].strip()
    links = sum(len(a.text(strip=True)) for a in block.css("a"))
    return (
        label.endswith(":")
        and 0 < len(label[:-1].split()) <= LABEL_WORDS
        and links >= 0.5 * len(text.strip())
    )


def _ancestors(node: LexborNode) -> list[LexborNode]:
    parents = []
    parent = node.parent
    while parent is not None and parent.tag not in ("body", "html"):
        parents.append(parent)
        parent = parent.parent
    return parents


@dataclass(frozen=True)
class MainContent:
    """The page reduced to its content blocks, in the page's own markup."""

    html: str
    text_chars: int
    """Characters of text kept (what the caller judges the extraction by)."""


_INVISIBLE = dict.fromkeys(map(ord, "\u00ad\u200b\u200c\u200d\u2060\ufeff"))
"""Soft hyphens and zero-width characters: inside words, not between them."""


_INVISIBLE_CHAR = re.compile("[\u00ad\u200b\u200c\u200d\u2060\ufeff]")


def _tokens(text: str, invisible: bool = True) -> list[str]:
    """The words of `text`, lower-case; `invisible=False`: the caller knows `text` holds no
    soft hyphen or zero-width character (the page has none)."""
    if invisible and _INVISIBLE_CHAR.search(text):  # rare: translate() costs more than search
        text = text.translate(_INVISIBLE)
    return _WORD.findall(text.lower())


def _shingles(tokens: list[str]) -> list[tuple[str, ...]]:
    return list(zip(*(tokens[i:] for i in range(SHINGLE)), strict=False))


def _units(root: etree._Element) -> list[tuple[etree._Element, list[str]]]:
    """Every block with text of its own, in document order, with its words."""
    return _blocks(root)[0]


def _blocks(
    root: etree._Element, invisible: bool = True
) -> tuple[list[tuple[etree._Element, list[str]]], dict[etree._Element, int]]:
    """`_units`, and the document order of every element, in one walk over the tree (`own_text`
    inlined: this runs for each of the page's hundreds of blocks)."""
    inline = INLINE_TAGS

    def own(node: etree._Element) -> str:
        parts = [node.text or ""]
        for child in node:
            if child.tag in inline:
                parts.append(own(child))
            parts.append(child.tail or "")
        return " ".join(parts)

    units = []
    order = {}
    for index, node in enumerate(root.iter()):
        order[node] = index
        tag = node.tag
        if tag in inline or not isinstance(tag, str):
            continue
        text = own(node)
        if text.strip():
            units.append((node, _tokens(text, invisible)))
    return units, order


def _strip_own(node: etree._Element, keep: set[etree._Element]) -> None:
    """Remove the text of `node` and its inline children, keeping nested kept blocks."""
    node.text = None
    for child in list(node):
        child.tail = None
        if is_inline(child):
            if any(d in keep for d in child.iterdescendants()):
                _strip_own(child, keep)
            else:
                node.remove(child)


def _remove(node: etree._Element) -> None:
    """Remove `node` and its subtree, keeping the text that follows it (its tail)."""
    parent = node.getparent()
    if parent is None:
        return
    tail = node.tail
    if tail:
        previous = node.getprevious()
        if previous is not None:
            previous.tail = (previous.tail or "") + tail
        else:
            parent.text = (parent.text or "") + tail
    parent.remove(node)


def _prune(node: etree._Element) -> None:
    """Drop the elements left without text or media (and comments)."""
    for child in list(node):
        if not isinstance(child.tag, str):
            _remove(child)
        elif child.tag not in MEDIA_TAGS and child.tag not in ("br", "hr"):
            _prune(child)
            if not _kept_content(child):
                _remove(child)


def _drop_dead(root: etree._Element, alive: set[etree._Element]) -> None:
    """Remove at once the subtrees without a kept block or media (all `_prune` would remove,
    element by element): on most pages that is most of the page."""
    holders: set[etree._Element] = set()
    for node in alive:
        for parent in node.iterancestors():
            if parent in holders:
                break  # and so are all its ancestors
            holders.add(parent)

    def drop(node: etree._Element) -> None:
        for child in list(node):
            if child in alive:
                continue
            if child in holders:
                drop(child)
            elif child.tag not in ("br", "hr"):
                _remove(child)

    drop(root)


def _kept_content(node: etree._Element) -> bool:
    """Whether a pruned element has text or media: its remaining child elements other than
    <br>/<hr> have (`_prune` went through them first), so they need no second look."""
    if (node.text or "").strip():
        return True
    return any((child.tail or "").strip() or child.tag not in ("br", "hr") for child in node)


def _containers(strong: set[etree._Element]) -> set[etree._Element]:
    """The elements that hold the extractor's blocks (the page's <body> is none)."""
    parents = {n.getparent() for n in strong}
    return {p for p in parents if p is not None and p.tag not in ("body", "html")}


def _in_container(node: etree._Element, containers: set[etree._Element]) -> bool:
    ancestor = node.getparent()
    for _ in range(FILL_DEPTH):
        if ancestor is None:
            return False
        if ancestor in containers:
            return True
        ancestor = ancestor.getparent()
    return False


def _siblings(
    units: list[tuple[etree._Element, list[str]]],
    strong: set[etree._Element],
    keep: set[etree._Element],
    containers: set[etree._Element],
) -> list[etree._Element]:
    """Blocks that the extractor left out: list items, definitions, table cells and code in the
    containers of its blocks, when they are not mostly links (a docs page's closing list), and
    headings right above a block of its text. Paragraphs, captions and other headings are not
    added back: measured, those are more often "Share this", "More on this" or photo credits."""
    found = []
    for i, (node, tokens) in enumerate(units):
        if node in keep or not tokens:
            continue
        heading = node.tag in HEADING_TAGS and i + 1 < len(units) and units[i + 1][0] in strong
        if heading or (
            node.tag in FILLED_TAGS and _in_container(node, containers) and link_density(node) < 0.5
        ):
            found.append(node)
    return found


def _oracle_tree(page: str) -> lxml.html.HtmlElement | None:
    """The tree trafilatura.utils.load_html makes of a str `page` (the same repairs, the same
    retry with bytes, the same rejection of what is not HTML), parsed with _ORACLE_PARSER."""
    # trafilatura at first use: a daemon that extracts no main content (collector, tracker)
    # does not pay its import (0.3 s of CPU with courlan, htmldate and urllib3).
    from trafilatura.utils import is_dubious_html, repair_faulty_html

    beginning = page[:50].lower()
    page = repair_faulty_html(page, beginning)
    tree = None
    try:
        tree = lxml.html.fromstring(page, parser=_ORACLE_PARSER)
    except ValueError:  # a str with an encoding declaration: lxml wants bytes
        pass
    except Exception:
        return None
    if tree is None or len(tree) < 1:
        try:
            tree = lxml.html.fromstring(page.encode("utf8", "surrogatepass"), parser=_ORACLE_PARSER)
        except Exception:
            return None
    if tree is not None and is_dubious_html(beginning) and len(tree) < 2:
        return None
    return tree


def _reference(page: str) -> tuple[Counter[tuple[str, ...]], str] | None:
    import trafilatura

    tree = _oracle_tree(page)
    text = trafilatura.extract(
        tree if tree is not None else page,
        include_comments=False,
        include_tables=True,
        include_formatting=False,
    )
    if not text:
        return None
    tokens = _tokens(text)
    return Counter(_shingles(tokens)), f" {' '.join(tokens)} "


def _matched(
    units: list[tuple[etree._Element, list[str]]], reference: Counter[tuple[str, ...]]
) -> set[etree._Element]:
    """The blocks of SHINGLE words or more that the extractor's text holds. Each occurrence
    of a 3-gram in that text matches one block only, purest blocks first: a comment-thread title
    or a teaser that quotes the headline does not match once the headline has."""
    candidates = []
    held = reference.__contains__
    for index, (node, tokens) in enumerate(units):
        if len(tokens) >= SHINGLE:
            grams = _shingles(tokens)
            share = sum(map(held, grams)) / len(grams)
            if share >= KEEP_SHARE:
                candidates.append((-share, index, node, grams))
    candidates.sort(key=lambda c: (c[0], c[1]))
    matched = set()
    count = reference.get
    for _, _, node, grams in candidates:
        found = [g for g in grams if count(g, 0) > 0]
        if len(found) >= KEEP_SHARE * len(grams):
            matched.add(node)
            reference.subtract(found)
    return matched


def extract_main_content(html: str, page: str | None = None) -> MainContent | None:
    """The content blocks of a cleaned page `html` (script/style already removed), or None when
    the extractor finds none. The extractor reads `page`, the page as fetched, when given (its
    scores use what cleaning removes, such as scripts), else `html`. Blocks are kept whole or
    dropped whole; media among kept blocks stay; iframes and form fields never do."""
    if not html.strip():
        return None
    try:
        tree = etree.fromstring(html, _PARSER)
    except (etree.ParserError, ValueError):
        return None
    if tree is None:
        return None
    for node in list(tree.iter("rt", "rp")):
        _remove(node)  # ruby annotations (furigana): pronunciation, not text
    for node in [n for n in HIDING(tree) if hidden(n)]:
        _remove(node)  # html-to-markdown drops it: matching it would spend the reference's text
    for node in tree.iter("abbr", "acronym"):
        node.attrib.pop("title", None)  # html-to-markdown would append it to the text
    reference = _reference(page if page is not None else html)
    if reference is None:
        return None
    ref_shingles, ref_text = reference
    for node in list(tree.iter("title", "head")):
        _remove(node)  # the <title> is no block of the page (some pages put it in <body>)
    units, order = _blocks(tree, invisible=_INVISIBLE_CHAR.search(html) is not None)
    strong = _matched(units, ref_shingles)
    if not strong:
        return None
    first = min(order[n] for n in strong)
    last = max(order[n] for n in strong)
    # The short blocks the extractor's text holds, between its first and last block and the one
    # right after (`sign_off`): only those are read.
    span = [i for i, (node, _) in enumerate(units) if node in strong]
    short = {
        node
        for node, tokens in units[span[0] : span[-1] + 2]
        if len(tokens) < SHINGLE and (not tokens or f" {' '.join(tokens)} " in ref_text)
    }
    keep = set(strong)
    keep.update(n for n in short if order[n] <= last)
    keep.update(sign_off(units, strong, short))
    containers = _containers(strong)
    keep.update(_siblings(units, strong, keep, containers))
    keep.update(headings_above(units, keep))
    region = content_region(strong)
    asides: dict[etree._Element, bool] = {}
    keep = {n for n in keep if not see_also(n) and not in_aside(n, region, asides)}
    if not keep:
        return None
    for node, _ in units:
        if node not in keep:
            _strip_own(node, keep)
    for node in list(tree.iter(*MEDIA_TAGS)):
        if not first <= order[node] <= last and not _in_container(node, containers):
            _remove(node)
    for node in list(tree.iter(*NOT_CONTENT.split(", "))):
        _remove(node)
    body = tree.find("body")
    root = body if body is not None else tree
    _drop_dead(root, keep | set(root.iter(*MEDIA_TAGS)))
    _prune(root)
    merge_twins(root)
    text_chars = sum(len(own_text(n).strip()) for n in keep)
    inner = "".join(etree.tostring(child, encoding="unicode", method="html") for child in root)
    html = unicodedata.normalize("NFC", (root.text or "") + inner)
    return MainContent(html=html, text_chars=text_chars)
