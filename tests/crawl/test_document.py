from __future__ import annotations

import json
from urllib.parse import urljoin

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.crawl.content.document import (
    BASE64_IMAGE_REMOVED,
    DocumentOptions,
    build_document,
    clean_html,
    decode_body,
    page_links,
    plain_join,
    scrape_page,
)
from daemon.crawl.fetching.fetch import FetchResult

PAGE = """<!doctype html>
<html lang="en-GB">
<head>
  <title> Rich page </title>
  <base href="http://site.test/docs/">
  <meta name="description" content="A page with everything">
  <meta name="keywords" content="a, b">
  <meta name="robots" content="index">
  <meta property="og:title" content="OG title">
  <meta property="og:image" content="http://site.test/og.png">
  <meta property="og:locale:alternate" content="fr_FR">
  <meta property="og:locale:alternate" content="de_DE">
  <meta property="article:published_time" content="2025-01-02">
  <meta name="DC.description" content="dc desc">
  <meta name="generator" content="gen 1">
  <meta name="custom" content="one">
  <meta name="custom" content="two">
  <link rel="icon" href="/favicon.ico">
  <script>var x = 1;</script>
  <style>p { color: red }</style>
</head>
<body>
  <header><a href="/home">Home</a></header>
  <nav class="navbar"><a href="nav-link">Nav</a></nav>
  <div class="sidebar"><div id="main"><p>kept because it holds #main</p></div></div>
  <article>
    <h1>Title</h1>
    <p>Body <a href="rel/page">relative</a> <a href="#top">top</a>
       <a href="mailto:me@site.test">mail</a> <a href="javascript:void(0)">js</a>
       <a href="rel/page">again</a></p>
    <pre><code class="language-python">print("hi")</code></pre>
    <table><tr><th>k</th><th>v</th></tr><tr><td>1</td><td>2</td></tr></table>
    <img src="data:image/png;base64,iVBORw0KGgo=" alt="inline">
    <img srcset="small.png 320w, large.png 1280w, mid.png 640w" src="small.png" alt="pic">
    <noscript>no js</noscript>
    <div class="ad">buy</div>
  </article>
  <footer><a href="http://other.test/legal">Legal</a></footer>
</body>
</html>"""


def result(
    body: str | bytes, content_type: str = "text/html; charset=utf-8", **kw: object
) -> FetchResult:
    data = body.encode() if isinstance(body, str) else body
    fields: dict[str, object] = {
        "requested_url": "http://site.test/docs/page",
        "url": "http://site.test/docs/page",
        "status_code": 200,
        "content_type": content_type,
        "headers": {},
        "body": data,
        "redirects": [],
    }
    fields.update(kw)
    return FetchResult(**fields)  # type: ignore[arg-type]


ALL = frozenset({"markdown", "html", "rawHtml", "links", "images"})


def doc(body: str | bytes, **options: object) -> dict[str, object]:
    opts = DocumentOptions(**{"formats": ALL, **options})  # type: ignore[arg-type]
    return build_document(
        result(body), opts, source_url="http://site.test/docs/page", scrape_id="s1"
    )


def test_main_content_markdown() -> None:
    d = doc(PAGE)
    md = d["markdown"]
    assert isinstance(md, str)
    assert md.startswith("kept because it holds #main")
    assert "# Title" in md
    assert '```python\nprint("hi")\n```' in md
    assert "| k | v |" in md
    assert f"![inline]({BASE64_IMAGE_REMOVED})" in md
    assert "![pic](http://site.test/docs/large.png)" in md
    assert "[relative](http://site.test/docs/rel/page)" in md
    for gone in ("Home", "Nav", "Legal", "buy", "var x", "color: red", "no js"):
        assert gone not in md


def test_html_is_cleaned_and_absolute() -> None:
    html = doc(PAGE)["html"]
    assert isinstance(html, str)
    assert "<script" not in html and "<style" not in html and "<head" not in html
    assert "<noscript" not in html and "<nav" not in html and "<footer" not in html
    assert 'src="http://site.test/docs/large.png"' in html
    assert 'href="http://site.test/docs/rel/page"' in html


def test_raw_html_is_the_body() -> None:
    assert doc(PAGE)["rawHtml"] == PAGE


def test_without_main_content_keeps_nav_and_footer() -> None:
    md = doc(PAGE, only_main_content=False)["markdown"]
    assert isinstance(md, str)
    assert "Nav" in md and "Legal" in md and "Home" in md
    assert "var x" not in md


def test_base64_images_kept_when_asked() -> None:
    md = doc(PAGE, remove_base64_images=False)["markdown"]
    assert isinstance(md, str)
    assert "data:image/png;base64,iVBORw0KGgo=" in md


def test_links_of_cleaned_html() -> None:
    links = doc(PAGE)["links"]
    assert links == ["http://site.test/docs/rel/page", "mailto:me@site.test"]
    links_all = doc(PAGE, only_main_content=False)["links"]
    assert links_all == [
        "http://site.test/home",
        "http://site.test/docs/nav-link",
        "http://site.test/docs/rel/page",
        "mailto:me@site.test",
        "http://other.test/legal",
    ]


def test_page_links_from_raw_html() -> None:
    links = page_links(result(PAGE))
    assert links == [
        "http://site.test/home",
        "http://site.test/docs/nav-link",
        "http://site.test/docs/rel/page",
        "http://other.test/legal",
    ]
    opts = DocumentOptions(formats=frozenset({"markdown"}))
    _, crawl_links = scrape_page(result(PAGE), opts, source_url="x", scrape_id="s")
    assert crawl_links == links


def test_page_links_without_base_use_final_url() -> None:
    page = (
        '<a href="a">a</a><a href="/b">b</a><a href="//cdn.test/c">c</a><a href="ftp://x/y">f</a>'
    )
    r = result(page, url="http://site.test/dir/after-redirect")
    assert page_links(r) == ["http://site.test/dir/a", "http://site.test/b", "http://cdn.test/c"]
    assert page_links(result("{}", "application/json")) == []


def test_metadata() -> None:
    meta = doc(PAGE)["metadata"]
    assert isinstance(meta, dict)
    assert meta["title"] == "Rich page"
    assert meta["description"] == "A page with everything"
    assert meta["language"] == "en-GB"
    assert meta["keywords"] == "a, b"
    assert meta["robots"] == "index"
    assert meta["ogTitle"] == "OG title"
    assert meta["ogImage"] == "http://site.test/og.png"
    assert meta["ogLocaleAlternate"] == ["fr_FR", "de_DE"]
    assert meta["publishedTime"] == "2025-01-02"
    assert meta["dcDescription"] == "dc desc"
    assert meta["og:title"] == "OG title"
    assert meta["generator"] == "gen 1"
    assert meta["custom"] == ["one", "two"]
    assert meta["favicon"] == "http://site.test/favicon.ico"
    assert meta["sourceURL"] == "http://site.test/docs/page"
    assert meta["url"] == "http://site.test/docs/page"
    assert meta["statusCode"] == 200
    assert meta["contentType"] == "text/html; charset=utf-8"
    assert meta["scrapeId"] == "s1"
    assert meta["proxyUsed"] == "basic"
    assert meta["creditsUsed"] == 1


def test_core_metadata_wins_over_a_meta_tag_of_the_same_name() -> None:
    page = (
        '<meta name="url" content="http://evil.test/"><meta name="statusCode" content="x"><p>hi</p>'
    )
    meta = doc(page)["metadata"]
    assert isinstance(meta, dict)
    assert meta["url"] == "http://site.test/docs/page"
    assert meta["statusCode"] == 200


def test_only_requested_formats() -> None:
    opts = DocumentOptions(formats=frozenset({"links"}))
    d = build_document(result(PAGE), opts, source_url="u", scrape_id="s")
    assert set(d) == {"links", "metadata"}
    d = build_document(result(PAGE), DocumentOptions(), source_url="u", scrape_id="s")
    assert set(d) == {"markdown", "metadata"}


def test_empty_main_content_falls_back_to_whole_page() -> None:
    page = "<html><body><nav><a href='/x'>Only navigation</a></nav></body></html>"
    d = doc(page)
    assert d["markdown"] == "[Only navigation](http://site.test/x)\n"
    assert d["links"] == ["http://site.test/x"]


def test_include_and_exclude_tags() -> None:
    page = "<div class='a'><p>one</p><span class='x'>drop</span></div><div class='b'>two</div><p>three</p>"
    md = doc(page, include_tags=(".a", ".b"), exclude_tags=(".x",))["markdown"]
    assert isinstance(md, str)
    assert "one" in md and "two" in md
    assert "three" not in md and "drop" not in md


def test_json_is_fenced_and_text_passes_through() -> None:
    body = json.dumps({"a": 1})
    d = build_document(
        result(body, "application/json"),
        DocumentOptions(formats=ALL),
        source_url="u",
        scrape_id="s",
    )
    assert d["markdown"] == '```json\n{"a": 1}\n```'
    assert d["links"] == []
    meta = d["metadata"]
    assert meta["contentType"] == "application/json"
    d = build_document(
        result("plain *text*", "text/plain"), DocumentOptions(), source_url="u", scrape_id="s"
    )
    assert d["markdown"] == "plain *text*"


@pytest.mark.parametrize(
    ("body", "content_type", "text"),
    [
        ("héllo".encode("latin-1"), "text/html; charset=ISO-8859-1", "héllo"),
        ('<meta charset="latin-1">é'.encode("latin-1"), "text/html", '<meta charset="latin-1">é'),
        ("é".encode(), "text/html", "é"),
        (b"\xff", "text/html; charset=nonsense", "\ufffd"),
    ],
)
def test_decode_body(body: bytes, content_type: str, text: str) -> None:
    assert decode_body(body, content_type) == text


def test_clean_html_largest_srcset_by_density() -> None:
    tree = clean_html(
        '<img srcset="a.png 1x, b.png 3x, c.png 2x">', "http://s.test/", only_main_content=True
    )
    assert 'src="http://s.test/b.png"' in (tree.html or "")


def test_converter_failure_falls_back_to_text(monkeypatch: pytest.MonkeyPatch) -> None:
    import html_to_markdown

    from daemon.crawl.content import document

    def refuse(html: str) -> object:
        raise html_to_markdown.ConversionError("boom")

    monkeypatch.setattr(document, "_convert_markdown", refuse)
    md = doc("<article><h1>Head</h1><p>Body text</p></article>")["markdown"]
    assert md == "Head\nBody text"


@pytest.mark.parametrize(
    "body",
    [
        b"",
        bytes(range(256)) * 50,
        b"<div>" * 3000 + b"deep" + b"</div>" * 3000,
        b"<ul>" + b"<li><ul>" * 1000 + b"x",
        b'<a href="' + b"a" * 100_000 + b'">x</a>',
        b"\x00<html><body>\x00x<img srcset=',,, 12q'></body></html>",
        b'<base href="javascript:alert(1)"><a href="x">x</a><a href="http://[::1">bad</a>',
    ],
)
def test_hostile_markup_never_raises(body: bytes) -> None:
    d = doc(body)
    assert isinstance(d["markdown"], str)
    assert all(isinstance(link, str) for link in d["links"])  # type: ignore[attr-defined]
    page_links(result(body))


def test_title_of_the_head_not_of_an_svg() -> None:
    page = "<body><svg><title>icon</title></svg><p>x</p></body>"
    assert "title" not in doc(page)["metadata"]  # type: ignore[operator]
    page = (
        "<html><head><title>Real</title></head><body><svg><title>icon</title></svg></body></html>"
    )
    assert doc(page)["metadata"]["title"] == "Real"  # type: ignore[index]


JOIN_BASES = [
    "https://site.test/docs/page.html",
    "http://site.test",
    "https://user@site.test:8080/a;b?c#d",
    "https://site.test?q",
]
JOIN_HREFS = [
    "https://other.test/x", "http://other.test/x", "https://other.test", "https://other.test?q",
    "https://other.test#", "https://other.test/x?", "https://[::1]/", "https://é.test/",
    "https://other.test/é x", "/x/y", "/", "/a//b", "/x?q=1", "/x?a;b", "/x#f", "/é?é#é", "/x??",
    "/x?", "/x#", "/x?#f", "/x;p", "/x/../y", "/./y", "/..", "/a/.", "//other.test/x", "x/y",
    "../x", "?q", "#f", "https:x", "/x\ty",
]  # fmt: skip


@pytest.mark.parametrize("base", JOIN_BASES)
@pytest.mark.parametrize("href", JOIN_HREFS)
def test_plain_join_is_urljoin_or_declines(base: str, href: str) -> None:
    joined = plain_join(base, href)
    assert joined is None or joined == urljoin(base, href)


URL_CHARS = st.sampled_from(list("aZ09-._~%!$&'()*+,;=:@/?#[] \t\né"))


@given(
    base=st.sampled_from(JOIN_BASES),
    head=st.sampled_from(["https://", "http://", "/", "//", ""]),
    tail=st.text(URL_CHARS, max_size=24),
)
def test_plain_join_agrees_with_urljoin(base: str, head: str, tail: str) -> None:
    href = head + tail
    joined = plain_join(base, href)
    if joined is not None:
        assert joined == urljoin(base, href)


def test_markdown_uses_the_prepared_options_and_converts_as_the_library_does() -> None:
    from html_to_markdown import convert

    from daemon.crawl.content import document

    assert document._convert_markdown.__name__ == "converted"  # not the per-call fallback
    html = "<h1>T</h1><p>a <b>b</b> <a href='/x'>c</a></p><ul><li>d</li></ul><nav>n</nav>"
    expected = convert(html, document._MARKDOWN_OPTIONS).content
    assert document.to_markdown(html, remove_base64_images=False) == expected
