# A fetched page becomes a Firecrawl Document here, as pure functions over bytes, so every rule of
# the scrape pipeline (cleaning, main content, links, metadata) is tested on literal HTML without
# a server. The page is parsed once with selectolax (Lexbor): the raw-HTML links the crawler
# follows, the metadata and the `attributes` format (attributes.py) are read first, then the same
# tree is cleaned in place for the `html`, `markdown` and `links` formats.
#
# `onlyMainContent` runs a content extractor (maincontent.py) on the cleaned page, because
# Firecrawl's selector blacklist keeps comment threads and teaser lists and can drop the article.
# The blacklist stays as the fallback when the extractor finds nothing convincing, then the whole
# page, so a page built only of, say, <nav> still has content; `links` and `images` stay
# Firecrawl's (the blacklisted page), and onlyMainContent=false is untouched.
# Markdown comes from html-to-markdown (Rust): fenced code with its language, GFM tables.
from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urljoin

import msgspec
from html_to_markdown import ConversionError, ConversionOptions, PreprocessingOptions, convert
from selectolax.lexbor import LexborHTMLParser, LexborNode

from daemon.crawl.content.attributes import Selector
from daemon.crawl.content.attributes import extract as extract_attributes
from daemon.crawl.content.maincontent import (
    MIN_TEXT,
    NOT_CONTENT,
    extract_main_content,
    is_plain_page,
    plain_main_element,
)
from daemon.crawl.fetching.fetch import FetchResult

FORMATS = frozenset({"markdown", "html", "rawHtml", "links", "images"})
"""Formats `build_document` produces (the others need a browser or an LLM)."""

MAIN_CONTENT_EXCLUDES = (
    "header, footer, nav, aside, .header, .top, .navbar, #header, .footer, .bottom, #footer, "
    ".sidebar, .side, .aside, #sidebar, .modal, .popup, #modal, .overlay, .ad, .ads, .advert, "
    "#ad, .lang-selector, .language, #language-selector, .social, .social-media, .social-links, "
    "#social, .menu, .navigation, #nav, .breadcrumbs, #breadcrumbs, .share, #share, .widget, "
    "#widget, .cookie, #cookie"
)
"""Removed with onlyMainContent unless they contain `#main` (Firecrawl's list)."""

ALWAYS_REMOVED = ("script", "style", "noscript", "meta", "head")

SWALLOWING_NOSCRIPT = 500
"""A <noscript> with more text than this (characters) is unwrapped, not removed: an unclosed
element inside it (`<noscript><div></noscript>`) makes the parser put the rest of the page in it."""

BASE64_IMAGE_REMOVED = "<Base64-Image-Removed>"

# The converter's own preprocessing (dropping <nav>, forms) is off: what is kept is decided by
# the cleaning above, so onlyMainContent=false keeps navigation as Firecrawl does.
_MARKDOWN_OPTIONS = ConversionOptions(
    extract_metadata=False, preprocessing=PreprocessingOptions(enabled=False)
)


def _markdown_converter() -> Callable[[str], str | None]:
    """`convert(html, _MARKDOWN_OPTIONS).content`, with the options made into the converter's
    own object once: `convert` rebuilds that object from ConversionOptions on every call, a
    third of a small page's document time. The library's plain `convert` should its private
    names move (the version is pinned; tests/crawl/test_document.py checks this path is taken)."""
    try:
        from html_to_markdown import _html_to_markdown as rust
        from html_to_markdown.api import _to_rust_conversion_options

        prepared = _to_rust_conversion_options(_MARKDOWN_OPTIONS)
        rust_convert = rust.convert
    except (ImportError, AttributeError):
        return lambda html: convert(html, _MARKDOWN_OPTIONS).content

    def converted(html: str) -> str | None:
        return rust_convert(html=html, options=prepared, visitor=None).content

    return converted


_convert_markdown = _markdown_converter()
_BASE64_IMAGE = re.compile(r"(!\[[^\]]*\])\(<?data:[^)>]*>?\)")
_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.I)
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_JSON_SUFFIX = ("/json", "+json")

# og/dc/article meta names with the camelCase keys Firecrawl gives them.
_NAMED_META = {
    "description": "description",
    "keywords": "keywords",
    "robots": "robots",
    "og:title": "ogTitle",
    "og:description": "ogDescription",
    "og:url": "ogUrl",
    "og:image": "ogImage",
    "og:audio": "ogAudio",
    "og:determiner": "ogDeterminer",
    "og:locale": "ogLocale",
    "og:locale:alternate": "ogLocaleAlternate",
    "og:site_name": "ogSiteName",
    "og:video": "ogVideo",
    "dcterms.created": "dcTermsCreated",
    "dc.date.created": "dcDateCreated",
    "dc.date": "dcDate",
    "dcterms.type": "dcTermsType",
    "dc.type": "dcType",
    "dcterms.audience": "dcTermsAudience",
    "dcterms.subject": "dcTermsSubject",
    "dc.subject": "dcSubject",
    "dc.description": "dcDescription",
    "dcterms.keywords": "dcTermsKeywords",
    "article:published_time": "publishedTime",
    "article:modified_time": "modifiedTime",
    "article:tag": "articleTag",
    "article:section": "articleSection",
}
_LIST_META = frozenset({"ogLocaleAlternate"})


class DocumentOptions(msgspec.Struct, frozen=True):
    """What a scrape returns: `formats` ⊆ FORMATS, and the cleaning options."""

    formats: frozenset[str] = frozenset({"markdown"})
    only_main_content: bool = True
    include_tags: tuple[str, ...] = ()
    exclude_tags: tuple[str, ...] = ()
    remove_base64_images: bool = True
    attributes: tuple[Selector, ...] = ()
    """The `attributes` format's (selector, attribute) pairs, read from the uncleaned page."""


def media_type(content_type: str) -> str:
    """The media type of a Content-Type value, lower-case, without parameters."""
    return content_type.split(";", 1)[0].strip().lower()


def is_html(result: FetchResult) -> bool:
    kind = media_type(result.content_type)
    if kind in _HTML_TYPES:
        return True
    return not kind and result.body.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html"))


def is_json(content_type: str) -> bool:
    return media_type(content_type).endswith(_JSON_SUFFIX)


def decode_body(body: bytes, content_type: str) -> str:
    """The body as text: the Content-Type charset, else an HTML <meta charset>, else UTF-8
    (undecodable bytes replaced, never an error)."""
    charset = None
    for param in content_type.split(";")[1:]:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            charset = value.strip().strip("\"'")
    if charset is None:
        found = _CHARSET.search(body[:4096])
        charset = found.group(1).decode("ascii") if found else "utf-8"
    try:
        return body.decode(charset, "replace")
    except LookupError:
        return body.decode("utf-8", "replace")


def _absolute(base: str, href: str) -> str | None:
    href = href.strip()
    if not href:
        return None
    return _join(base, href)


@functools.lru_cache(maxsize=16384)
def _join(base: str, href: str) -> str | None:
    """urljoin, remembered: a page's links are joined twice (links and cleaned html), and a
    site's menus repeat on every page of a crawl."""
    joined = plain_join(base, href)
    if joined is not None:
        return joined
    try:
        return urljoin(base, href)
    except ValueError:
        return None


_NETLOC = r"[A-Za-z0-9\-._~%!$&'()*+,;=:@]+"
_AFTER_PATH = r"(?:\?[^#\t\n\r]+)?(?:#[^\t\n\r]+)?"
_PLAIN_BASE = re.compile(rf"(https?://{_NETLOC})(?:[/?#][^\t\n\r]*)?")
_PLAIN_ABSOLUTE = re.compile(rf"https?://{_NETLOC}(?:/[^?#;\t\n\r]*)?{_AFTER_PATH}")
_PLAIN_ROOTED = re.compile(rf"/(?!/)([^?#;\t\n\r]*){_AFTER_PATH}")
_DOT_SEGMENT = re.compile(r"(?:^|/)\.\.?(?:/|$)")


def plain_join(base: str, href: str) -> str | None:
    """urljoin(base, href) without parsing, for the two shapes most links have, else None:
    an absolute http(s) URL with an ASCII host (urljoin gives it back as it is) and a path from
    the root without "." or ".." segments (the base's scheme and host, then `href`). Neither
    may hold what urljoin would rewrite: an empty "?" or "#", a ";" in the path, tabs or line
    breaks. A page has hundreds of links; urljoin parses both URLs each time."""
    base_match = _PLAIN_BASE.fullmatch(base)
    if base_match is None:
        return None
    if _PLAIN_ABSOLUTE.fullmatch(href):
        return href
    rooted = _PLAIN_ROOTED.fullmatch(href)
    if rooted is not None and not _DOT_SEGMENT.search(rooted.group(1)):
        return base_match.group(1) + href
    return None


def _base_url(tree: LexborHTMLParser, page_url: str) -> str:
    base = tree.css_first("base[href]")
    href = base.attributes.get("href") if base is not None else None
    if href:
        joined = _absolute(page_url, href)
        if joined and joined.startswith(("http://", "https://")):
            return joined
    return page_url


def _hrefs(nodes: Iterable[LexborNode], base: str, *, keep_mailto: bool) -> list[str]:
    seen: dict[str, None] = {}
    for node in nodes:
        href = (node.attributes.get("href") or "").strip()
        if not href or href.startswith("#"):
            continue
        if href.lower().startswith("mailto:"):
            if keep_mailto:
                seen.setdefault(href, None)
            continue
        url = _absolute(base, href)
        if url and url.startswith(("http://", "https://")):
            seen.setdefault(url, None)
    return list(seen)


def _raw_links(tree: LexborHTMLParser, page_url: str) -> list[str]:
    return _hrefs(tree.css("a[href]"), _base_url(tree, page_url), keep_mailto=False)


def page_links(result: FetchResult) -> list[str]:
    """Absolute http(s) `<a href>` targets of the RAW html (what the crawler follows),
    resolved against the final URL or `<base href>`, deduplicated in page order. Empty for a
    non-HTML page."""
    if not is_html(result):
        return []
    tree = LexborHTMLParser(decode_body(result.body, result.content_type))
    return _raw_links(tree, result.url)


def page_outline(result: FetchResult) -> tuple[list[str], dict[str, str]]:
    """page_links, and the page's `title` and `description` (its meta description, else its
    og:description) when it has them, from one parse (what /v2/map says of a page it read)."""
    if not is_html(result):
        return [], {}
    tree = LexborHTMLParser(decode_body(result.body, result.content_type))
    metadata = extract_metadata(tree, result.url)
    known = {
        "title": metadata.get("title") or metadata.get("ogTitle"),
        "description": metadata.get("description") or metadata.get("ogDescription"),
    }
    return _raw_links(tree, result.url), {
        k: v.strip() for k, v in known.items() if isinstance(v, str) and v.strip()
    }


def _meta_value(existing: Any, value: str) -> str | list[str]:
    if existing is None:
        return value
    if isinstance(existing, list):
        return [*existing, value]
    return [existing, value]


def extract_metadata(tree: LexborHTMLParser, page_url: str) -> dict[str, Any]:
    """Title, description, language, favicon, og/dc/article tags under Firecrawl's keys, and
    every meta name/property under its own name (a string, or a list when repeated)."""
    metadata: dict[str, Any] = {}
    title = tree.css_first("head > title") or tree.css_first("title:not(svg title)")
    if title is not None:
        metadata["title"] = title.text(strip=True)
    html = tree.css_first("html")
    lang = html.attributes.get("lang") if html is not None else None
    if lang:
        metadata["language"] = lang
    raw: dict[str, Any] = {}
    for meta in tree.css("meta"):
        attrs = meta.attributes
        name = attrs.get("name") or attrs.get("property") or attrs.get("itemprop")
        content = attrs.get("content")
        if not name or content is None:
            continue
        raw[name] = _meta_value(raw.get(name), content)
        key = _NAMED_META.get(name.lower())
        if key is not None:
            value = metadata.get(key)
            if key in _LIST_META:
                metadata[key] = [*(value or []), content]
            elif value is None:
                metadata[key] = content
    for name, value in raw.items():
        metadata.setdefault(name, value)
    icon = tree.css_first('link[rel~="icon"][href], link[rel="shortcut icon"][href]')
    if icon is not None:
        favicon = _absolute(_base_url(tree, page_url), icon.attributes.get("href") or "")
        if favicon:
            metadata["favicon"] = favicon
    return metadata


def _largest_srcset(srcset: str) -> str | None:
    best: tuple[float, str] | None = None
    for candidate in srcset.split(","):
        parts = candidate.strip().split()
        if not parts:
            continue
        size = 1.0
        if len(parts) > 1 and parts[1][-1:] in ("w", "x"):
            try:
                size = float(parts[1][:-1])
            except ValueError:
                continue
        if best is None or size > best[0]:
            best = (size, parts[0])
    return best[1] if best else None


def clean_html(
    raw: str | LexborHTMLParser,
    page_url: str,
    *,
    only_main_content: bool,
    include_tags: tuple[str, ...] = (),
    exclude_tags: tuple[str, ...] = (),
) -> LexborHTMLParser:
    """The `html` format's tree: includeTags kept, script/style/noscript/meta/head removed,
    excludeTags removed, the main-content blacklist applied, largest srcset as src, img src
    and a href made absolute. A tree passed in is cleaned in place."""
    tree = LexborHTMLParser(raw) if isinstance(raw, str) else raw
    base = _base_url(tree, page_url)
    if include_tags:
        kept = [node.html or "" for sel in include_tags for node in tree.css(sel)]
        tree = LexborHTMLParser(f"<div>{''.join(kept)}</div>")
    for noscript in tree.css("noscript"):
        if len(noscript.text(strip=True)) > SWALLOWING_NOSCRIPT:
            noscript.unwrap()
    tree.strip_tags(list(ALWAYS_REMOVED))
    for selector in exclude_tags:
        for node in tree.css(selector):
            node.remove()
    if only_main_content:
        remove_blacklisted(tree)
    for img in tree.css("img"):
        attrs = img.attrs
        srcset = attrs.get("srcset")
        if srcset:
            largest = _largest_srcset(srcset)
            if largest:
                attrs["src"] = largest
        src = attrs.get("src")
        if src and not src.startswith("data:"):
            absolute = _absolute(base, src)
            if absolute:
                attrs["src"] = absolute
    for link in tree.css("a[href]"):
        href = link.attrs.get("href") or ""
        if href and not href.startswith(("#", "mailto:", "javascript:")):
            absolute = _absolute(base, href)
            if absolute:
                link.attrs["href"] = absolute
    return tree


def remove_blacklisted(tree: LexborHTMLParser) -> None:
    """Firecrawl's onlyMainContent: MAIN_CONTENT_EXCLUDES removed unless they hold `#main`."""
    for node in tree.css(MAIN_CONTENT_EXCLUDES):
        if node.css_first("#main") is None:
            node.remove()


def _has_content(tree: LexborHTMLParser) -> bool:
    root = tree.body or tree.root
    if root is None:
        return False
    return bool(root.text(strip=True)) or root.css_first("img") is not None


def extracts_main_content(options: DocumentOptions) -> bool:
    """Whether a page's document may run the content extractor (tens of ms of CPU for a large
    page: the caller runs all but small pages in a worker thread)."""
    return options.only_main_content and bool(options.formats & {"markdown", "html"})


def main_content(
    tree: LexborHTMLParser, raw: str, *, links: bool = True
) -> tuple[LexborHTMLParser, str, str]:
    """onlyMainContent on a cleaned page (`raw`: the page as fetched): (the tree `links` and
    `images` come from, the html of the content, how it was chosen). In order: a page without
    any boilerplate hint is kept whole ("plain"); else its one plain <main>/<article> when that
    holds most of its text ("element"); else the content extractor's blocks
    ("extractor"); else Firecrawl's blacklist ("blacklist"); else the whole cleaned page
    ("page"). `links` and `images` always come from the blacklisted page, as Firecrawl's do;
    with `links=False` (neither format asked for) the tree returned by the "element" and
    "extractor" steps is not blacklisted (41 selectors over the page: a millisecond)."""
    for node in tree.css(NOT_CONTENT):
        node.remove()
    if is_plain_page(tree):
        return tree, tree.html or "", "plain"
    element = plain_main_element(tree)
    if element is not None:
        html = element.html or ""
        if links:
            remove_blacklisted(tree)
        return tree, html, "element"
    page = tree.html or ""
    found = extract_main_content(page, raw)
    if found is not None and found.text_chars >= MIN_TEXT:
        if links:
            remove_blacklisted(tree)
        return tree, found.html, "extractor"
    remove_blacklisted(tree)
    if _has_content(tree):
        return tree, tree.html or "", "blacklist"
    return LexborHTMLParser(page), page, "page"


def to_markdown(html: str, *, remove_base64_images: bool) -> str:
    """Markdown of cleaned html; the page's plain text if the converter refuses the input
    (a page never fails for its markup)."""
    try:
        markdown = _convert_markdown(html) or ""
    except ConversionError:
        markdown = LexborHTMLParser(html).text(separator="\n", strip=True)
    if remove_base64_images:
        markdown = _BASE64_IMAGE.sub(rf"\1({BASE64_IMAGE_REMOVED})", markdown)
    return markdown


def _html_document(
    text: str, result: FetchResult, options: DocumentOptions
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    formats = options.formats
    tree = LexborHTMLParser(text)
    metadata = extract_metadata(tree, result.url)
    base = _base_url(tree, result.url)
    crawl_links = _hrefs(tree.css("a[href]"), base, keep_mailto=False)
    document: dict[str, Any] = {}
    if options.attributes:
        document["attributes"] = extract_attributes(tree, options.attributes)
    if formats & {"markdown", "html", "links", "images"}:
        clean = functools.partial(
            clean_html,
            page_url=result.url,
            only_main_content=False,
            include_tags=options.include_tags,
            exclude_tags=options.exclude_tags,
        )
        if options.only_main_content:
            links = bool(formats & {"links", "images"})
            tree, html, metadata["contentExtraction"] = main_content(clean(tree), text, links=links)
        else:
            tree = clean(tree)
            html = tree.html or ""
        if "markdown" in formats:
            document["markdown"] = to_markdown(
                html, remove_base64_images=options.remove_base64_images
            )
        if "html" in formats:
            document["html"] = html
        if "links" in formats:
            document["links"] = _hrefs(tree.css("a[href]"), base, keep_mailto=True)
        if "images" in formats:
            seen = dict.fromkeys(
                src
                for img in tree.css("img[src]")
                if (src := img.attributes.get("src") or "").startswith(("http://", "https://"))
            )
            document["images"] = list(seen)
    if "rawHtml" in formats:
        document["rawHtml"] = text
    return document, metadata, crawl_links


def build_document(
    result: FetchResult, options: DocumentOptions, *, source_url: str, scrape_id: str
) -> dict[str, Any]:
    """The Firecrawl Document JSON of a fetched page: only the requested formats, and
    `metadata` (page metadata + sourceURL, url, statusCode, contentType, scrapeId, proxyUsed,
    creditsUsed). JSON bodies become a ```json fence in markdown; other text passes through."""
    return scrape_page(result, options, source_url=source_url, scrape_id=scrape_id)[0]


def scrape_page(
    result: FetchResult, options: DocumentOptions, *, source_url: str, scrape_id: str
) -> tuple[dict[str, Any], list[str]]:
    """`build_document` and `page_links` from one parse of the page (what the crawler calls)."""
    text = decode_body(result.body, result.content_type)
    formats = options.formats
    metadata: dict[str, Any]
    links: list[str] = []
    if is_html(result):
        document, metadata, links = _html_document(text, result, options)
    else:
        markdown = f"```json\n{text}\n```" if is_json(result.content_type) else text
        document, metadata = plain_formats(formats, markdown, text), {}
    document["metadata"] = with_fetch_metadata(
        metadata, source_url, result.url, result.status_code, result.content_type, scrape_id
    )
    return document, links


def scrape_page_of(
    result: FetchResult, options: DocumentOptions, source_url: str, scrape_id: str
) -> tuple[dict[str, Any], list[str]]:
    """`scrape_page` with positional arguments: what a content worker (pool.py) is sent."""
    return scrape_page(result, options, source_url=source_url, scrape_id=scrape_id)


def plain_formats(formats: Any, markdown: str, shown: str) -> dict[str, Any]:
    """The formats of a document that is not an HTML page: `markdown`, `shown` as html and
    rawHtml, no links or images."""
    document: dict[str, Any] = {}
    if "markdown" in formats:
        document["markdown"] = markdown
    if "html" in formats:
        document["html"] = shown
    if "rawHtml" in formats:
        document["rawHtml"] = shown
    if "links" in formats:
        document["links"] = []
    if "images" in formats:
        document["images"] = []
    return document


def with_fetch_metadata(
    metadata: dict[str, Any],
    source_url: str,
    url: str,
    status_code: int,
    content_type: str | None,
    scrape_id: str,
) -> dict[str, Any]:
    """`metadata` with what every document says of its fetch (Firecrawl's names)."""
    metadata.update(
        sourceURL=source_url,
        url=url,
        statusCode=status_code,
        contentType=content_type,
        scrapeId=scrape_id,
        proxyUsed="basic",
        creditsUsed=1,
    )
    return metadata
