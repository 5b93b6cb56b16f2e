from __future__ import annotations

import pytest

from daemon.crawl.fetching.urls import (
    CrawlScope,
    compile_paths,
    dedupe_key,
    refused_extension,
    registrable_domain,
)


@pytest.mark.parametrize(
    ("a", "b", "ignore_query", "similar", "same"),
    [
        ("http://a.test/p#x", "http://a.test/p", False, False, True),
        ("http://a.test/p?b=1&a=2", "http://a.test/p?a=2&b=1", False, False, False),
        ("http://a.test/p?b=1&a=2", "http://a.test/p?b=1&a=2#f", False, False, True),
        ("http://a.test/p?x=1", "http://a.test/p?x=2", True, False, True),
        ("http://a.test/p?x=1", "http://a.test/p?x=2", False, True, False),
        ("http://www.a.test/p", "http://a.test/p", False, False, False),
        ("http://www.a.test/p", "http://a.test/p", False, True, True),
        ("https://a.test/p", "http://a.test/p", False, True, True),
        ("https://a.test/p", "http://a.test/p", False, False, False),
        ("http://a.test/p/", "http://a.test/p", False, True, True),
        ("http://a.test/p/", "http://a.test/p", False, False, False),
        ("http://a.test/d/index.html", "http://a.test/d/", False, True, True),
        ("http://a.test/d/index.php", "http://a.test/d", False, True, True),
        ("http://a.test/index.html", "https://www.a.test/", False, True, True),
        ("http://a.test/myindex.html", "http://a.test/", False, True, False),
        ("http://A.TEST:80/p", "http://a.test/p", False, False, True),
        ("http://a.test:8080/p", "http://a.test/p", False, True, False),
        ("http://a.test/P", "http://a.test/p", False, True, False),
        ("http://a.test/?q=1", "http://a.test?q=1", False, True, True),
    ],
)
def test_dedupe_key(a: str, b: str, ignore_query: bool, similar: bool, same: bool) -> None:
    ka = dedupe_key(a, ignore_query=ignore_query, similar=similar)
    kb = dedupe_key(b, ignore_query=ignore_query, similar=similar)
    assert (ka == kb) is same, (ka, kb)


def test_dedupe_key_keeps_query_order_and_drops_fragment() -> None:
    assert dedupe_key("http://a.test/p?b=1&a=2#top", ignore_query=False, similar=False) == (
        "http://a.test/p?b=1&a=2"
    )


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("http://a.test/x.png", True),
        ("http://a.test/x.JPG", True),
        ("http://a.test/x.css?v=1", True),
        ("http://a.test/font.woff2", True),
        ("http://a.test/doc.pdf", False),
        ("http://a.test/doc.docx", False),
        ("http://a.test/sitemap.xml", False),
        ("http://a.test/page", False),
        ("http://a.test/v1.2/page", False),
        ("http://a.test/js/", False),
    ],
)
def test_refused_extension(url: str, refused: bool) -> None:
    assert refused_extension(url) is refused


@pytest.mark.parametrize(
    ("host", "domain"),
    [
        ("blog.site.test", "site.test"),
        ("www.example.com", "example.com"),
        ("a.b.example.co.uk", "example.co.uk"),
        ("127.0.0.1", "127.0.0.1"),
    ],
)
def test_registrable_domain(host: str, domain: str) -> None:
    assert registrable_domain(host) == domain


START = "http://site.test/docs"

# (scope options, url, expected refusal substring or None)
SCOPE_TABLE = [
    ({}, "http://site.test/docs/a", None),
    ({}, "http://www.site.test/docs/a", None),
    ({}, "https://site.test/docs/a", None),
    ({}, "http://site.test/docs", None),
    ({}, "http://site.test/docsx", None),  # string prefix, as Firecrawl
    ({}, "http://site.test/other", "start path"),
    ({"crawl_entire_domain": True}, "http://site.test/other", None),
    ({}, "http://site.test/docs/a#section", "#fragment"),
    ({}, "http://site.test/docs/#/route", None),
    ({}, "mailto:me@site.test", "http(s)"),
    ({}, "ftp://site.test/docs/a", "http(s)"),
    ({}, "http://blog.site.test/docs/a", "domain"),
    ({"allow_subdomains": True}, "http://blog.site.test/docs/a", None),
    ({"allow_subdomains": True}, "http://blog.site.test/other", "start path"),
    ({"allow_subdomains": True}, "http://evil.test/docs/a", "domain"),
    ({"allow_external_links": True}, "http://other.test/some/page", None),
    ({"allow_external_links": True}, "http://other.test/", "home page"),
    ({"allow_external_links": True}, "https://www.facebook.com/site", "social"),
    ({"allow_external_links": True}, "https://github.com/x/y", "social"),
    ({}, "http://other.test/docs/a", "domain"),
    ({}, "http://site.test/docs/logo.png", "file type"),
    ({}, "http://site.test/docs/manual.pdf", None),
    ({"exclude_paths": ("secret",)}, "http://site.test/docs/a/secret/b", "excludePaths"),
    ({"exclude_paths": ("^/docs/x",)}, "http://site.test/docs/x1", "excludePaths"),
    ({"exclude_paths": ("^/x",)}, "http://site.test/docs/x1", None),
    ({"include_paths": ("/blog/",)}, "http://site.test/docs/blog/1", None),
    ({"include_paths": ("/blog/",)}, "http://site.test/docs/news/1", "includePaths"),
    ({"include_paths": (r"\d+$",), "exclude_paths": ("7",)}, "http://site.test/docs/7", "exclude"),
    # query is not part of the path ...
    ({"include_paths": ("page=2",)}, "http://site.test/docs/a?page=2", "includePaths"),
    # ... but is part of the full URL
    (
        {"include_paths": ("page=2",), "regex_on_full_url": True},
        "http://site.test/docs/a?page=2",
        None,
    ),
    (
        {"include_paths": ("^https://",), "regex_on_full_url": True},
        "http://site.test/docs/a",
        "includePaths",
    ),
]


@pytest.mark.parametrize(("options", "url", "expected"), SCOPE_TABLE)
def test_scope_refusal(options: dict[str, object], url: str, expected: str | None) -> None:
    scope = CrawlScope(start_url=START, **options)  # type: ignore[arg-type]
    refusal = scope.refusal(url)
    if expected is None:
        assert refusal is None
    else:
        assert refusal is not None and expected in refusal, refusal


def test_scope_root_start_admits_every_path() -> None:
    scope = CrawlScope(start_url="http://site.test/")
    assert scope.refusal("http://site.test/a/b/c") is None
    assert scope.is_internal("http://www.site.test/x")
    assert not scope.is_internal("http://blog.site.test/x")


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("(?=a)b", "invalid regex"),
        ("(?<!a)b", "invalid regex"),
        (r"(a)\1", "invalid regex"),
        ("[unclosed", "invalid regex"),
        ("x" * 1001, "longer than"),
    ],
)
def test_compile_paths_refuses_bad_patterns(pattern: str, message: str) -> None:
    with pytest.raises(ValueError, match="excludePaths\\[1\\]") as info:
        compile_paths(["ok", pattern], field="excludePaths")
    assert message in str(info.value)


def test_compile_paths_is_linear_on_a_backtracking_bomb() -> None:
    (pattern,) = compile_paths(["(a+)+$"])
    assert pattern.search("a" * 5000 + "!") is None  # Python's re would not return
