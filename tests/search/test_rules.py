"""The search rules with plain values: SearXNG parameters, result mapping, domain filters."""

from __future__ import annotations

import pytest

from daemon.search.config import SearchConfig
from daemon.search.rules import (
    Hit,
    SearchQuery,
    add_page,
    allowed,
    category_of,
    params,
    to_item,
    warnings,
)


def test_params_map_language_time_range_safesearch_and_engines() -> None:
    q = SearchQuery(query=" trio  ", lang="de", country="de", tbs="qdr:w", safe=True)
    assert params(q, "news", 2, ["duckduckgo", "wikipedia"]) == {
        "q": "trio", "format": "json", "pageno": "2", "categories": "news",
        "language": "de-DE", "safesearch": "2", "time_range": "week",
        "engines": "duckduckgo,wikipedia",
    }  # fmt: skip
    plain = params(SearchQuery(query="x", lang=""), "web", 1, [])
    assert plain["language"] == "all" and "time_range" not in plain and "engines" not in plain
    assert plain["categories"] == "general" and plain["safesearch"] == "0"


def test_query_text_carries_site_and_filetype_filters() -> None:
    q = SearchQuery(query="async", include_domains=("docs.python.org",), categories=("pdf",))
    assert params(q, "web", 1, [])["q"] == "async site:docs.python.org filetype:pdf"
    two = SearchQuery(query="async", include_domains=("a.org", "b.org"))
    assert params(two, "web", 1, [])["q"] == "async"  # several: filtered afterwards
    assert params(SearchQuery(query="q", categories=("github",)), "web", 1, [])["q"] == (
        "q site:github.com"
    )


def test_warnings_name_what_searxng_cannot_take() -> None:
    assert warnings(SearchQuery(query="q")) == []
    said = warnings(SearchQuery(query="q", location="Berlin", tbs="cdr:1,cd_min:1/1/2024"))
    assert len(said) == 2 and "location" in said[0] and "cdr:1" in said[1]


@pytest.mark.parametrize(
    ("url", "include", "exclude", "kept"),
    [
        ("https://www.Example.org/a", ("example.org",), (), True),
        ("https://example.org.evil.test/", ("example.org",), (), False),
        ("https://notexample.org/", ("example.org",), (), False),
        ("https://blog.example.org/", (), ("example.org",), False),
        ("https://other.org/", (), ("example.org",), True),
        ("not a url", (), (), False),
    ],
)
def test_domain_filters(url: str, include: tuple[str, ...], exclude: tuple[str, ...],
                        kept: bool) -> None:  # fmt: skip
    q = SearchQuery(query="q", include_domains=include, exclude_domains=exclude)
    assert allowed(url, q) is kept


def test_categories_filter_hosts() -> None:
    assert allowed("https://github.com/x/y", SearchQuery(query="q", categories=("github",)))
    assert not allowed("https://gitlab.com/x", SearchQuery(query="q", categories=("github",)))
    assert allowed("https://arxiv.org/abs/1", SearchQuery(query="q", categories=("research",)))
    assert not allowed("https://blog.test/", SearchQuery(query="q", categories=("research",)))


@pytest.mark.parametrize(
    ("url", "categories", "source", "kept", "category"),
    [
        ("https://github.com/x/y/issues/1", ("developer",), "web", True, "developer"),
        ("https://stackoverflow.com/q/1", ("developer",), "web", True, "developer"),
        ("https://trio.readthedocs.io/en/", ("developer",), "web", True, "developer"),
        ("https://docs.rs/trio", ("developer",), "web", True, "developer"),
        ("https://blog.example.org/", ("developer",), "web", False, None),
        ("https://www.fda.gov/food", ("gov",), "web", True, "gov"),
        ("https://www.army.mil/", ("gov",), "web", True, "gov"),
        ("https://www.fs.fed.us/", ("gov",), "web", True, "gov"),
        ("https://gov.example.org/", ("gov",), "web", False, None),
        ("https://www.gov.uk/", ("gov",), "web", False, None),
        ("https://github.com/a", ("github", "research"), "web", True, "github"),  # any of them
        ("https://arxiv.org/abs/1", ("github", "research"), "web", True, "research"),
        ("https://a.org/x.pdf", ("pdf",), "web", True, None),  # pdf: a query operator only
        ("https://blog.example.org/", ("developer",), "news", True, None),  # web only
    ],
)
def test_categories_keep_their_sites(
    url: str, categories: tuple[str, ...], source: str, kept: bool, category: str | None
) -> None:
    q = SearchQuery(query="q", categories=categories)
    assert allowed(url, q, source) is kept
    hit = Hit(source)
    add_page(hit, [{"url": url, "title": "t"}], q)
    assert [i.get("category") for i in hit.items] == ([category] if kept else [])
    if source == "web":
        host = url.split("/")[2]
        assert category_of(host, categories) == category


@pytest.mark.parametrize(
    ("categories", "source", "q", "searxng"),
    [
        ((), "web", "retries", "general"),
        (("developer",), "web", "retries", "general,it"),
        (("developer",), "news", "retries", "news"),
        (("gov",), "web", "retries site:gov", "general"),
        (("gov",), "news", "retries", "news"),
        (("github", "pdf"), "web", "retries site:github.com filetype:pdf", "general"),
        (("research",), "web", "retries", "general"),
    ],
)
def test_categories_in_the_searxng_request(
    categories: tuple[str, ...], source: str, q: str, searxng: str
) -> None:
    sent = params(SearchQuery(query="retries", categories=categories), source, 1, [])
    assert (sent["q"], sent["categories"]) == (q, searxng)


def test_results_become_firecrawl_items() -> None:
    web = {"url": "https://a.org/", "title": " A ", "content": "about a", "category": "general"}
    assert to_item(web, "web") == ("https://a.org/", {"url": "https://a.org/", "title": "A",
                                                      "description": "about a"})  # fmt: skip
    news = {"url": "https://n.org/1", "title": "N", "content": "s", "publishedDate":
            "2026-11-01T08:00:00", "thumbnail": "https://n.org/t.jpg"}  # fmt: skip
    assert to_item(news, "news") == ("https://n.org/1", {"title": "N", "url": "https://n.org/1",
        "snippet": "s", "date": "2026-11-01T08:00:00", "imageUrl": "https://n.org/t.jpg"})  # fmt: skip
    image = {"url": "https://i.org/p", "title": "I", "img_src": "https://i.org/i.png",
             "resolution": "640 x 480"}  # fmt: skip
    assert to_item(image, "images") == ("https://i.org/p", {"title": "I",
        "imageUrl": "https://i.org/i.png", "url": "https://i.org/p", "imageWidth": 640,
        "imageHeight": 480})  # fmt: skip
    assert to_item({"url": "javascript:alert(1)"}, "web") is None
    assert to_item({"title": "no url"}, "web") is None
    assert to_item("garbage", "web") is None
    assert to_item({"url": "https://a.org/", "resolution": "big"}, "images") == (
        "https://a.org/",
        {"url": "https://a.org/"},
    )


def test_pages_fill_up_to_the_limit_without_duplicates() -> None:
    q = SearchQuery(query="q", limit=3, exclude_domains=("bad.org",))
    hit = Hit("web")
    page = [{"url": "https://a.org/"}, {"url": "https://a.org/"}, {"url": "https://bad.org/"},
            {"url": "https://b.org/"}]  # fmt: skip
    assert add_page(hit, page, q) == 4
    assert [i["url"] for i in hit.items] == ["https://a.org/", "https://b.org/"]
    assert add_page(hit, [{"url": "https://c.org/"}, {"url": "https://d.org/"}], q) == 2
    assert [i["position"] for i in hit.items] == [1, 2, 3] and hit.items[2]["url"].endswith(
        "c.org/"
    )
    assert add_page(hit, None, q) == 0 and add_page(hit, [], q) == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"base_url": "ftp://x"}, "base_url"),
        ({"timeout": 0}, "timeout"),
        ({"retries": 9}, "retries"),
        ({"max_pages": 0}, "max_pages"),
        ({"scrape_concurrency": 0}, "scrape_concurrency"),
        ({"engines": ["a,b"]}, "engines"),
        ({"highlight_timeout": 0}, "highlight_timeout"),
        ({"highlight_pages": 101}, "highlight_pages"),
    ],
)
def test_config_checks(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SearchConfig(**fields)  # type: ignore[arg-type]
    assert not SearchConfig().enabled and SearchConfig(base_url="http://127.0.0.1:1").enabled
