# The `attributes` format (Firecrawl v2): `{type: "attributes", selectors: [{selector, attribute}]}`
# answers `attributes: [{selector, attribute, values}]`, read from the page's DOM with CSS
# selectors and no model call, as Firecrawl's Rust transformer does (an attribute that is absent
# is looked up again as `data-<attribute>`). Pure functions over plain values and a parsed tree,
# tested with tables.
#
# Decided for crawld: the DOM is the whole page as fetched (or rendered), before onlyMainContent
# and includeTags/excludeTags clean it, so `meta[property="og:image"]` and links in a header are
# found; values come in document order as the DOM has them (entities decoded, URLs as written);
# a selector that does not parse is a 400 at the request (Firecrawl silently answers []).
# firecrawl-py 4.55 sends an AttributesFormat object as the bare string "attributes", dropping
# its selectors: that is a 400 telling the SDK user to pass a dict.
from __future__ import annotations

from typing import Any

from selectolax.lexbor import LexborHTMLParser, SelectolaxError

from daemon.crawl.problems import Problem, problem

KEYS = frozenset({"type", "selectors"})
MAX_SELECTORS = 100
MAX_SELECTOR_CHARS = 1000
MAX_ATTRIBUTE_CHARS = 256
BARE = (
    'the attributes format needs `selectors`: send it as an object {"type": "attributes", '
    '"selectors": [{"selector": "a.product", "attribute": "href"}]} (firecrawl-py 4.55 sends '
    'an AttributesFormat as the bare string "attributes" and drops its selectors: pass a dict '
    "in `formats` instead)"
)

Selector = tuple[str, str]
"""(CSS selector, attribute name) as the request gave them."""

_PROBE = LexborHTMLParser("<p></p>")


def check_format(fmt: str | dict[str, Any], where: str) -> list[Problem]:
    """Problems (400) of one `attributes` format."""
    if not isinstance(fmt, dict):
        return [problem(f"{where}.selectors", BARE)]
    problems = [
        problem(f"{where}.{key}"[:200], "unrecognized key") for key in sorted(fmt)[:20]
        if key not in KEYS
    ]  # fmt: skip
    selectors = fmt.get("selectors")
    if not isinstance(selectors, list) or not selectors:
        why = BARE if selectors is None else "a non-empty list of {selector, attribute} objects"
        return [*problems, problem(f"{where}.selectors", why)]
    if len(selectors) > MAX_SELECTORS:
        return [*problems, problem(f"{where}.selectors", f"at most {MAX_SELECTORS} selectors")]
    for i, item in enumerate(selectors):
        problems += _item_problems(item, f"{where}.selectors[{i}]")
    return problems


def _item_problems(item: Any, where: str) -> list[Problem]:
    if not isinstance(item, dict):
        return [problem(where, "an object {selector, attribute}")]
    problems = [
        problem(f"{where}.{key}"[:200], "unrecognized key") for key in sorted(item)[:20]
        if key not in ("selector", "attribute")
    ]  # fmt: skip
    selector, attribute = item.get("selector"), item.get("attribute")
    if not isinstance(selector, str) or not selector.strip():
        problems.append(problem(f"{where}.selector", "a CSS selector string"))
    elif len(selector) > MAX_SELECTOR_CHARS:
        problems.append(problem(f"{where}.selector", f"at most {MAX_SELECTOR_CHARS} characters"))
    elif not parses(selector):
        problems.append(problem(f"{where}.selector", f"not a CSS selector: {selector[:100]!r}"))
    if not isinstance(attribute, str) or not attribute.strip():
        problems.append(problem(f"{where}.attribute", "an attribute name such as 'href'"))
    elif len(attribute) > MAX_ATTRIBUTE_CHARS:
        problems.append(problem(f"{where}.attribute", f"at most {MAX_ATTRIBUTE_CHARS} characters"))
    return problems


def parses(selector: str) -> bool:
    """Whether Lexbor reads `selector` as CSS."""
    try:
        _PROBE.css(selector)
    except SelectolaxError:
        return False
    return True


def selectors_of(formats: list[Any]) -> tuple[Selector, ...]:
    """The (validated) selectors of the `attributes` format of `formats`; () when none."""
    for fmt in formats:
        if isinstance(fmt, dict) and fmt.get("type") == "attributes":
            return tuple((str(s["selector"]), str(s["attribute"])) for s in fmt["selectors"])
    return ()


def extract(tree: LexborHTMLParser, selectors: tuple[Selector, ...]) -> list[dict[str, Any]]:
    """One entry per selector in request order: the attribute's value on every element the
    selector matches, in document order; `data-<attribute>` when the element lacks the
    attribute itself; an element with neither adds nothing. A boolean attribute is ""."""
    out = []
    for selector, attribute in selectors:
        name = attribute.strip().lower()
        fallback = None if name.startswith("data-") else f"data-{name}"
        values: list[str] = []
        for node in tree.css(selector):
            attrs = node.attributes
            if name in attrs:
                values.append(attrs[name] or "")
            elif fallback is not None and fallback in attrs:
                values.append(attrs[fallback] or "")
        out.append({"selector": selector, "attribute": attribute, "values": values})
    return out


def empty(selectors: tuple[Selector, ...]) -> list[dict[str, Any]]:
    """The answer for a document without a DOM (a PDF, plain text, JSON): every entry empty."""
    return [{"selector": s, "attribute": a, "values": []} for s, a in selectors]
