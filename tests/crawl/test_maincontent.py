"""onlyMainContent as a content extractor (issue 24): one literal page per failure kind of
Firecrawl's selector blacklist, and the fallbacks that never lose the article."""

from __future__ import annotations

import re

import pytest
from lxml import etree

from daemon.crawl.content.document import DocumentOptions, build_document
from daemon.crawl.content.maincontent import _units, extract_main_content
from daemon.crawl.content.maincontent_rules import headings_above
from daemon.crawl.fetching.fetch import FetchResult

ARTICLE = """
<h1>How the river town rebuilt its bridge</h1>
<p>The old stone bridge over the Wend had carried carts, cars and school buses for two
centuries before the spring flood of last year cracked its central pier beyond repair.</p>
<p>Engineers from the county spent the summer measuring the riverbed, and concluded that a
single steel arch would clear the water at every height recorded since the records began.</p>
<h2>A bridge built by the town</h2>
<p>Rather than wait for a national programme, the council asked residents to vote on three
designs, and almost four thousand people took part in the ballot held in the old market hall.</p>
<ul><li>The arch spans forty-two metres between the banks.</li>
<li>Its deck is wide enough for two lanes and a protected cycle path.</li></ul>
<p>The new bridge opened in October, eleven months after the first pile was driven, and the
stones of the old pier now line the riverside walk where the ferry used to land.</p>
"""
"""An article of about 200 words, with its structure (headings, a list)."""

ARTICLE_WORDS = ("stone bridge over the Wend", "forty-two metres", "riverside walk")


def document(
    html: str,
    *,
    formats: frozenset[str] = frozenset({"markdown"}),
    only_main_content: bool = True,
    include_tags: tuple[str, ...] = (),
    exclude_tags: tuple[str, ...] = (),
) -> dict:
    options = DocumentOptions(
        formats=formats,
        only_main_content=only_main_content,
        include_tags=include_tags,
        exclude_tags=exclude_tags,
    )
    result = FetchResult(
        "http://site.test/post", "http://site.test/post", 200, "text/html", {}, html.encode()
    )
    return build_document(result, options, source_url="http://site.test/post", scrape_id="s1")


def page(body: str, title: str = "The bridge") -> str:
    return f"<!doctype html><html><head><title>{title}</title></head><body>{body}</body></html>"


def menu(*items: str) -> str:
    return "<ul>" + "".join(f'<li><a href="/{i.lower()}">{i}</a></li>' for i in items) + "</ul>"


def assert_article(markdown: str) -> None:
    for words in ARTICLE_WORDS:
        assert words in markdown
    assert "# How the river town rebuilt its bridge" in markdown
    assert "## A bridge built by the town" in markdown
    assert "- The arch spans forty-two metres" in markdown


BLOGGER = page(
    '<div class="header-outer"><div class="widget Header"><h1>Notes from the Wend</h1></div></div>'
    '<div class="main-outer"><div class="widget Blog" id="Blog1"><div class="post hentry">'
    f'<div class="post-body entry-content">{ARTICLE}</div></div></div></div>'
    '<div class="sidebar"><div class="widget Profile"><p>About me: I write about rivers.</p></div>'
    f'<div class="widget BlogArchive"><h2>Archive</h2>{menu("March", "April", "May")}</div></div>'
    '<div class="footer-outer"><p>Powered by Blogger.</p><p>Theme images by someone.</p></div>'
)


def test_blogger_article_inside_a_widget_is_kept() -> None:
    doc = document(BLOGGER)
    assert_article(doc["markdown"])
    assert "Powered by Blogger" not in doc["markdown"]
    assert "Archive" not in doc["markdown"]
    assert doc["metadata"]["contentExtraction"] == "extractor"


COMMENTS = "".join(
    f'<li class="comment" id="comment-{n}"><article class="comment-body">'
    f'<footer class="comment-meta"><b class="fn">Reader {n}</b> says:</footer>'
    f'<div class="comment-content"><p>Comment number {n}: I remember crossing the old bridge '
    f"every morning on the way to school, and I am glad the new one has a cycle path.</p>"
    f'</div><div class="reply"><a class="comment-reply-link" href="#r{n}">Reply</a></div>'
    f"</article></li>"
    for n in range(1, 16)
)

WORDPRESS = page(
    f'<header id="masthead" class="site-header"><p class="site-title">River news</p></header>'
    f'<div id="page" class="site"><main id="main" class="site-main">'
    f'<article id="post-7" class="post type-post"><div class="entry-content">{ARTICLE}</div>'
    f"</article>"
    f'<div id="comments" class="comments-area"><h2 class="comments-title">15 thoughts on '
    f'"How the river town rebuilt its bridge"</h2><ol class="comment-list">{COMMENTS}</ol>'
    f'<div id="respond" class="comment-respond"><h3>Leave a Reply</h3><form>'
    f'<textarea name="comment"></textarea><input type="submit" value="Post Comment"></form>'
    f"</div></div></main></div>"
)


def test_wordpress_comment_thread_is_dropped() -> None:
    markdown = document(WORDPRESS)["markdown"]
    assert_article(markdown)
    assert "Comment number" not in markdown
    assert "thoughts on" not in markdown
    assert "Leave a Reply" not in markdown


def teasers(heading: str, prefix: str) -> str:
    cards = "".join(
        f'<li class="card"><a href="/story/{prefix}{n}"><img src="/t{n}.jpg" alt="">'
        f"<span>{prefix} story number {n} that everyone is reading today</span></a></li>"
        for n in range(1, 9)
    )
    return f'<section class="rail"><h2>{heading}</h2><ul>{cards}</ul></section>'


NEWS = page(
    f'<div class="masthead">{menu("World", "Politics", "Business", "Sport", "Culture")}</div>'
    f'<div class="layout"><div class="story"><article class="story-body">{ARTICLE}'
    f"</article>{teasers('More in Politics', 'politics')}</div>"
    f'<div class="rightcol">{teasers("Trending", "trending")}'
    f'<div class="newsletter-box"><p>Get our newsletter every morning.</p></div></div></div>'
    '<div class="legal"><p>© River News 2026. All rights reserved.</p></div>'
)


def test_teaser_lists_trending_and_more_in_are_dropped() -> None:
    markdown = document(NEWS)["markdown"]
    assert_article(markdown)
    for gone in ("More in Politics", "Trending", "story number", "newsletter", "Rights reserved"):
        assert gone.lower() not in markdown.lower()


VIDEO = page(
    f"<article>{ARTICLE[:-1]}"
    '<p>Watch the opening:</p><iframe src="https://video.test/embed/42" width="560"></iframe>'
    "<p>The council published the full recording of the opening ceremony on its own channel, "
    "with the speeches of the mayor and of the engineers who designed the steel arch.</p>"
    "</article>"
)


def test_embedded_iframes_leave_no_line() -> None:
    markdown = document(VIDEO)["markdown"]
    assert_article(markdown)
    assert "full recording of the opening ceremony" in markdown
    assert "iframe" not in markdown
    assert "video.test" not in markdown
    full = document(VIDEO, only_main_content=False)["markdown"]
    assert "[iframe](https://video.test/embed/42)" in full  # onlyMainContent=false: as before


DOCS = page(
    '<nav class="topnav">' + menu("Docs", "API", "Blog", "GitHub") + "</nav>"
    '<div class="wrapper"><aside class="sidebar"><h3>Guide</h3>'
    + menu("Install", "Configure", "Deploy", "Upgrade", "FAQ")
    + '</aside><main><article class="doc"><h1>Configure the exporter</h1>'
    "<p>The exporter reads one TOML file at start. Every key has a default, so an empty file "
    "is a valid configuration; the keys below are the ones most deployments change.</p>"
    "<h2>Options</h2><table><thead><tr><th>Key</th><th>Default</th><th>Meaning</th></tr>"
    "</thead><tbody><tr><td>listen</td><td>127.0.0.1:9100</td><td>Address of the metrics "
    "endpoint</td></tr><tr><td>interval</td><td>15s</td><td>How often the exporter scrapes "
    "its targets</td></tr></tbody></table>"
    "<h2>Example</h2><p>A configuration that scrapes every five seconds:</p>"
    '<pre><code class="language-toml">listen = "0.0.0.0:9100"\ninterval = "5s"\n</code></pre>'
    "<p>Start the exporter with the file as its only argument:</p>"
    '<pre><code class="language-bash">exporter run config.toml</code></pre>'
    '<h2>See also</h2><ul><li><a href="/deploy">Deploy</a> the exporter as a service.</li>'
    '<li><a href="/upgrade">Upgrade</a> from an older release.</li></ul>'
    "</article></main></div>"
    '<footer class="site-footer"><p>© Exporter authors. Docs licensed CC-BY.</p></footer>'
)


def test_docs_page_is_kept_whole_with_its_structure() -> None:
    doc = document(DOCS)
    assert doc["metadata"]["contentExtraction"] == "element"
    markdown = doc["markdown"]
    assert "# Configure the exporter" in markdown
    assert re.search(
        r"\| listen +\| 127.0.0.1:9100 +\| Address of the metrics endpoint +\|", markdown
    )
    assert '```toml\nlisten = "0.0.0.0:9100"\ninterval = "5s"\n```' in markdown
    assert "```bash\nexporter run config.toml\n```" in markdown
    assert "Start the exporter with the file as its only argument" in markdown
    assert "[Deploy](http://site.test/deploy) the exporter as a service." in markdown
    assert "[Upgrade](http://site.test/upgrade) from an older release." in markdown
    assert "Guide" not in markdown
    assert "licensed CC-BY" not in markdown


def test_images_of_the_content_stay_with_absolute_urls() -> None:
    html = page(
        f"<article>{ARTICLE}<figure><img src='/img/arch.jpg' alt='The new arch'>"
        "<figcaption>The steel arch seen from the riverside walk, on the day it opened to "
        "traffic.</figcaption></figure><p>Work on the approach roads will finish in spring, "
        "when the temporary ferry landing is removed.</p></article>"
    )
    markdown = document(html)["markdown"]
    assert "![The new arch](http://site.test/img/arch.jpg)" in markdown
    assert "approach roads" in markdown


def test_nothing_convincing_falls_back_to_the_blacklist_then_the_page() -> None:
    short = page(f"<nav>{menu('Home', 'About')}</nav><p>Closed on Sundays.</p>")
    doc = document(short)
    assert doc["markdown"].strip() == "Closed on Sundays."
    assert doc["metadata"]["contentExtraction"] == "blacklist"

    only_nav = page(f"<nav>{menu('Home', 'About')}</nav>")
    doc = document(only_nav)
    assert "[Home](http://site.test/home)" in doc["markdown"]
    assert doc["metadata"]["contentExtraction"] == "page"

    assert document(page(""))["markdown"] == ""


def test_extractor_finds_nothing_in_an_empty_or_textless_page() -> None:
    assert extract_main_content("") is None
    assert extract_main_content("<html><body><img src='a.png'></body></html>") is None


def test_include_tags_select_before_extraction_and_exclude_tags_remove() -> None:
    html = page(
        f'<div id="post">{ARTICLE}<div class="promo"><p>Subscribe to the River News print '
        f"edition and get a free umbrella for the rainy season.</p></div></div>"
        f'<div id="other"><p>A second story about the town library, its new reading room and '
        f"the volunteers who painted it over three weekends in the winter.</p></div>"
    )
    doc = document(html, include_tags=("#post",))
    assert_article(doc["markdown"])
    assert "town library" not in doc["markdown"]
    doc = document(html, include_tags=("#post",), exclude_tags=(".promo", "ul"))
    assert "umbrella" not in doc["markdown"]
    assert "forty-two metres" not in doc["markdown"]  # the list, removed by excludeTags
    assert "stone bridge over the Wend" in doc["markdown"]
    doc = document(html, include_tags=("#other",))
    assert "town library" in doc["markdown"]
    assert "Wend" not in doc["markdown"]


@pytest.mark.parametrize("source", [BLOGGER, WORDPRESS, NEWS, DOCS])
def test_only_main_content_false_is_the_whole_cleaned_page(source: str) -> None:
    doc = document(source, only_main_content=False, formats=frozenset({"markdown", "html"}))
    assert "contentExtraction" not in doc["metadata"]
    assert "<nav" in doc["html"] or "<ul>" in doc["html"]
    if source is WORDPRESS:
        assert "Comment number 15" in doc["markdown"]
    if source is NEWS:
        assert "Trending" in doc["markdown"]


def test_links_and_images_formats_keep_firecrawls_page_wide_lists() -> None:
    doc = document(NEWS, formats=frozenset({"markdown", "links", "images"}))
    assert "http://site.test/story/politics1" in doc["links"]  # not in any blacklisted block
    assert "story number" not in doc["markdown"]
    assert "http://site.test/t1.jpg" in doc["images"]


def test_firecrawls_blacklist_is_only_main_content_false_plus_exclude_tags() -> None:
    """The docs' recipe for Firecrawl's exact onlyMainContent gives the old output
    (docs/explanations/main-content.md)."""
    from daemon.crawl.content.document import MAIN_CONTENT_EXCLUDES, clean_html, to_markdown

    exclude = tuple(f"{s.strip()}:not(:has(#main))" for s in MAIN_CONTENT_EXCLUDES.split(","))
    source = NEWS.replace('<div class="layout">', '<div class="side"><div id="main">kept</div>')
    for html in (BLOGGER, WORDPRESS, source, DOCS):
        old = clean_html(html, "http://site.test/post", only_main_content=True).html or ""
        recipe = document(html, only_main_content=False, exclude_tags=exclude)["markdown"]
        assert recipe == to_markdown(old, remove_base64_images=True)
    assert (
        "Comment number 15"
        in document(WORDPRESS, only_main_content=False, exclude_tags=exclude)["markdown"]
    )


README_PAGE = page(
    '<article class="markdown-body"><h1>tinyq</h1><p>A queue in one file. It keeps jobs in '
    "SQLite and runs them in threads.</p><h2>Install</h2>"
    '<pre><code class="language-sh">pip install tinyq</code></pre>'
    "<h2>Links</h2><ul><li><a href='/docs'>Documentation</a></li>"
    "<li><a href='/changes'>Changelog</a></li></ul></article>"
)


def test_a_page_without_boilerplate_is_kept_whole() -> None:
    doc = document(README_PAGE)
    assert doc["metadata"]["contentExtraction"] == "plain"
    markdown = doc["markdown"]
    assert "# tinyq" in markdown
    assert "```sh\npip install tinyq\n```" in markdown
    assert "- [Documentation](http://site.test/docs)" in markdown
    assert "- [Changelog](http://site.test/changes)" in markdown
    with_nav = README_PAGE.replace("<article", f"<nav>{menu('Home')}</nav><article")
    assert document(with_nav)["metadata"]["contentExtraction"] != "plain"
    links_only = page(menu(*(f"Page {n}" for n in range(30))))
    assert document(links_only)["metadata"]["contentExtraction"] != "plain"


def test_docs_page_with_a_hint_inside_main_goes_through_the_extractor() -> None:
    """A share bar inside <main>: the element is not plain, the extractor decides, and the
    docs content (table, code, closing list) still comes back."""
    source = DOCS.replace(
        "</article></main>", '</article><div class="share-bar"><a href="/x">Share</a></div></main>'
    )
    doc = document(source)
    assert doc["metadata"]["contentExtraction"] == "extractor"
    markdown = doc["markdown"]
    assert re.search(r"\| interval +\| 15s +\|", markdown)
    assert "```bash\nexporter run config.toml\n```" in markdown
    assert "[Upgrade](http://site.test/upgrade) from an older release." in markdown
    assert "Share" not in markdown


# Rules that refine the extractor's choice inside the content region: each one a kind of block
# that trafilatura keeps (or loses) on real pages, written here as literal HTML.

ARTICLE_HEAD, ARTICLE_TAIL = ARTICLE.split("<h2>")
ARTICLE_TAIL = "<h2>" + ARTICLE_TAIL


def news_page(
    article: str, *, before: str = "", title: str = "The bridge", bar: bool = True
) -> str:
    """A news page; with `bar`, a share bar inside the article makes the extractor decide."""
    share = '<div class="share-bar"><a href="/share">Share</a></div>' if bar else ""
    return page(
        f'<header class="masthead">{menu("World", "Politics", "Business", "Sport")}</header>'
        f'{before}<main><article class="story">{share}{article}</article></main>'
        f'<aside class="sidebar"><h3>Most read</h3>{menu("Floods", "Ferries", "Fares")}</aside>'
        '<footer class="site-footer"><p>© River News 2026.</p></footer>',
        title=title,
    )


def test_see_also_links_between_paragraphs_are_dropped() -> None:
    """ "Read more: <link>" in running text, whatever the label's language: a short label with a
    colon, then a link that is most of the block."""
    see_also = (
        '<p>Read more: <a href="/story/ferry">The ferry that crossed the Wend for a century</a></p>'
        '<p>Lea también: <a href="/story/puente">Otro puente sobre el río, otro pueblo</a></p>'
    )
    for bar in (True, False):  # without a share bar the <article> is not plain either
        doc = document(news_page(ARTICLE_HEAD + see_also + ARTICLE_TAIL, bar=bar))
        assert doc["metadata"]["contentExtraction"] == "extractor"
        assert "ferry that crossed" not in doc["markdown"]
    markdown = doc["markdown"]
    assert_article(markdown)
    assert "Read more" not in markdown
    assert "ferry that crossed" not in markdown
    assert "Lea también" not in markdown
    kept = '<p>Note: <a href="/vote">the ballot results</a> are public, with the turnout of each street.</p>'
    markdown = document(news_page(ARTICLE_HEAD + kept + ARTICLE_TAIL))["markdown"]
    assert "the turnout of each street" in markdown  # the link is not most of the block


def test_an_article_with_captioned_figures_goes_through_the_extractor() -> None:
    """A figure caption inside the one <article> makes it not plain: captions and photo credits
    are the extractor's to judge, so the "element" step does not keep them unseen."""
    figure = (
        "<figure><img src='/img/arch.jpg' alt='The new arch'><figcaption>The arch at dawn. "
        "Photo: County archive</figcaption></figure>"
    )
    plain = document(news_page(ARTICLE, bar=False))
    assert plain["metadata"]["contentExtraction"] == "element"
    doc = document(news_page(ARTICLE_HEAD + figure + ARTICLE_TAIL, bar=False))
    assert doc["metadata"]["contentExtraction"] == "extractor"
    assert_article(doc["markdown"])
    assert "![The new arch](http://site.test/img/arch.jpg)" in doc["markdown"]


def test_newsletter_related_and_credit_boxes_inside_the_article_are_dropped() -> None:
    boxes = (
        '<div class="inline-newsletter"><p>Every Friday the River News letter brings the week of '
        "the valley's towns to your inbox, with the stories our readers shared most.</p></div>"
        '<div class="related-stories"><p>How the county plans to repair the other old bridges '
        "over the Wend before the next flood season arrives in the valley.</p></div>"
        '<p class="photo-credit">Photograph by the county archive, used with permission.</p>'
    )
    markdown = document(news_page(ARTICLE_HEAD + boxes + ARTICLE_TAIL))["markdown"]
    assert_article(markdown)
    for gone in ("River News letter", "other old bridges", "county archive"):
        assert gone not in markdown


def test_a_hidden_copy_of_the_article_does_not_take_the_place_of_the_visible_one() -> None:
    """A paywall's faded copy (display:none) before the article: html-to-markdown drops hidden
    elements, so the extractor must match the visible paragraphs, not the hidden copy."""
    hidden = f'<div style="display: none"><div class="fade">{ARTICLE}</div></div>'
    markdown = document(news_page(ARTICLE, before=hidden))["markdown"]
    assert_article(markdown)
    assert markdown.count("stone bridge over the Wend") == 1


def test_heading_of_a_kept_table_and_the_title_heading_are_kept() -> None:
    table = (
        "<h3>Bridge in figures</h3><table><tr><th>Span</th><td>42 m</td></tr>"
        "<tr><th>Deck width</th><td>11 m</td></tr><tr><th>Opened</th><td>October</td></tr>"
        "</table>"
    )
    source = news_page(ARTICLE + table, title="How the river town rebuilt its bridge")
    markdown = document(source)["markdown"]
    assert_article(markdown)  # its h1 too, though the <title> says the same words
    assert "### Bridge in figures" in markdown


def test_a_short_sign_off_after_the_article_is_kept_a_dangling_label_is_not() -> None:
    markdown = document(news_page(ARTICLE + "<p>x Anna</p>"))["markdown"]
    assert markdown.rstrip().endswith("x Anna")
    markdown = document(news_page(ARTICLE + "<p>More topics:</p>"))["markdown"]
    assert "More topics" not in markdown


def test_adjacent_twin_emphasis_is_one_and_text_is_nfc() -> None:
    quote = (
        "<p><em><strong>“We built it ourselves</strong></em><strong></strong>"
        "<em><strong>, stone by stone”</strong></em>, said the cafe\u0301 owner by the river.</p>"
    )
    found = extract_main_content(news_page(ARTICLE_HEAD + quote + ARTICLE_TAIL))
    assert found is not None
    assert "<em><strong>“We built it ourselves, stone by stone”</strong></em>" in found.html
    assert "café owner" in found.html
    assert "cafe\u0301" not in found.html


def test_headings_right_above_a_kept_table_or_paragraph_are_kept_not_above_a_list() -> None:
    """The rule alone, on plain values: the extractor kept the table's cells and a paragraph,
    and a list of teasers was not kept."""
    tree = etree.fromstring(
        "<div><h3>Bridge in figures</h3><table><tr><td>Span 42 m</td></tr></table>"
        "<h2>Its history</h2><p>The first bridge was wooden.</p>"
        "<h3>More on this</h3><ul><li><a href='/a'>Another bridge</a></li></ul>"
        "<h3>Also more</h3><p>Not kept.</p></div>",
        etree.HTMLParser(),
    )
    units = _units(tree)
    keep = {n for n, _ in units if n.tag in ("td", "li")}
    keep.add(tree.find(".//p"))
    assert [n.text for n in headings_above(units, keep)] == ["Bridge in figures", "Its history"]
