"""The `attributes` format (daemon/crawl/content/attributes.py): what a format object may hold,
and the values read from the DOM (request order, document order, entities decoded, URLs as
written, the `data-` fallback), on the page before onlyMainContent cleans it."""

from __future__ import annotations

from typing import Any

import pytest
from selectolax.lexbor import LexborHTMLParser

from daemon.crawl.content import attributes
from daemon.crawl.content.document import DocumentOptions, build_document
from daemon.crawl.fetching.fetch import FetchResult

PAGE = """<!doctype html><html><head><title>Shop</title>
<meta property="og:image" content="/img/cover.png?w=1&amp;h=2"></head>
<body><nav><a class="nav" href="/home">Home</a></nav>
<main><h1>Products</h1>
<div class="product" data-sku="A-1" data-price="12.50"><a href="p/1?x=1&amp;y=2">One</a></div>
<div class="product" data-sku="B-2"><a href="https://other.example/p/2">Two</a></div>
<div class="product" sku="C-3"><a href="#three">Three</a></div>
<input type="checkbox" CHECKED data-Id="x">
<p>Enough text for a main content extractor to keep this block of the page as the article.
More words follow here so that the main content is convincing, and more words again.</p>
</main><footer><a href="/imprint">Imprint</a></footer></body></html>"""


def sel(*pairs: tuple[str, str]) -> dict[str, Any]:
    return {"type": "attributes", "selectors": [{"selector": s, "attribute": a} for s, a in pairs]}


BARE = "firecrawl-py 4.55 sends an AttributesFormat as the bare string"


@pytest.mark.parametrize(
    ("fmt", "path", "message"),
    [
        ("attributes", "$.formats[0].selectors", BARE),
        ({"type": "attributes"}, "$.formats[0].selectors", BARE),
        ({"type": "attributes", "selectors": []}, "$.formats[0].selectors", "non-empty list"),
        ({"type": "attributes", "selectors": "a"}, "$.formats[0].selectors", "non-empty list"),
        ({"type": "attributes", "selectors": ["a"]}, "$.formats[0].selectors[0]", "an object"),
        (sel(("a", "href")) | {"colour": 1}, "$.formats[0].colour", "unrecognized key"),
        (sel(("div >", "href")), "$.formats[0].selectors[0].selector", "not a CSS selector"),
        (sel(("", "href")), "$.formats[0].selectors[0].selector", "a CSS selector string"),
        (sel(("a", "")), "$.formats[0].selectors[0].attribute", "an attribute name"),
        (sel(("a", "x" * 300)), "$.formats[0].selectors[0].attribute", "at most 256"),
        ({"type": "attributes", "selectors": [{"selector": "a", "attribute": "href", "all": 1}]},
         "$.formats[0].selectors[0].all", "unrecognized key"),
        ({"type": "attributes", "selectors": [{"selector": "a", "attribute": "x"}] * 101},
         "$.formats[0].selectors", "at most 100"),
    ],
)  # fmt: skip
def test_bad_formats(fmt: Any, path: str, message: str) -> None:
    problems = attributes.check_format(fmt, "$.formats[0]")
    assert any(p["path"] == path and message in p["message"] for p in problems), problems


def test_good_format_and_its_selectors() -> None:
    fmt = sel(("a[href]", "href"), ("div.product", "sku"), (":is(h1, h2)", "id"))
    assert attributes.check_format(fmt, "$.formats[0]") == []
    assert attributes.selectors_of(["markdown", fmt]) == (
        ("a[href]", "href"), ("div.product", "sku"), (":is(h1, h2)", "id"))  # fmt: skip
    assert attributes.selectors_of(["markdown", "links"]) == ()


@pytest.mark.parametrize(
    ("selector", "attribute", "values"),
    [
        ("a", "href", ["/home", "p/1?x=1&y=2", "https://other.example/p/2", "#three", "/imprint"]),
        ("div.product", "data-sku", ["A-1", "B-2"]),
        ("div.product", "sku", ["A-1", "B-2", "C-3"]),  # data-sku, data-sku, then sku itself
        ("div.product", "data-price", ["12.50"]),
        ('meta[property="og:image"]', "content", ["/img/cover.png?w=1&h=2"]),
        ("input", "checked", [""]),
        ("input", "ID", ["x"]),  # names are case-insensitive in HTML; data-id as the fallback
        ("table", "class", []),
        ("div.product > a", "title", []),
    ],
)
def test_values_from_the_dom(selector: str, attribute: str, values: list[str]) -> None:
    [entry] = attributes.extract(LexborHTMLParser(PAGE), ((selector, attribute),))
    assert entry == {"selector": selector, "attribute": attribute, "values": values}


def test_entries_in_request_order_and_empty_for_no_dom() -> None:
    pairs = (("h1", "id"), ("a.nav", "href"))
    got = attributes.extract(LexborHTMLParser(PAGE), pairs)
    assert [e["selector"] for e in got] == ["h1", "a.nav"]
    assert got[1]["values"] == ["/home"]
    assert attributes.empty(pairs) == [{"selector": "h1", "attribute": "id", "values": []},
                                       {"selector": "a.nav", "attribute": "href", "values": []}]  # fmt: skip


def test_document_reads_the_page_before_main_content_cleans_it() -> None:
    result = FetchResult(requested_url="https://shop.test/", url="https://shop.test/",
                         status_code=200, content_type="text/html", headers={},
                         body=PAGE.encode())  # fmt: skip
    options = DocumentOptions(formats=frozenset({"markdown"}), only_main_content=True,
                              attributes=(("a", "href"), ("meta", "content")))  # fmt: skip
    document = build_document(result, options, source_url="https://shop.test/", scrape_id="s")
    assert "Imprint" not in document["markdown"]  # the footer is not main content...
    assert document["attributes"][0]["values"][-1] == "/imprint"  # ...but it is in the DOM
    assert document["attributes"][1]["values"] == ["/img/cover.png?w=1&h=2"]
    plain = build_document(result, DocumentOptions(), source_url="u", scrape_id="s")
    assert "attributes" not in plain
