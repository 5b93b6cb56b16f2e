"""The browser engine's pure rules: engine choice signals, Firecrawl's action schema (400s that
name the action), screenshot formats, languages; and the request validation built on them."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from daemon.crawl.options.models import (
    BadRequest,
    ScrapeOptions,
    check_scrape_options,
    parse_scrape,
)
from daemon.crawl.rendering import render_rules as rr
from daemon.crawl.runs.pages import page_plan
from daemon.fakes import js_site

SHELL = "<html><body><div id='{id}'></div><script src='/app.js'></script></body></html>"


@pytest.mark.parametrize(
    ("html", "signal"),
    [
        ("<html><body><h1>Plain</h1><p>No scripts at all.</p></body></html>", None),
        ("<html><body><div id='root'></div></body></html>", None),  # no script: never
        (SHELL.format(id="root"), "app-root"),
        (SHELL.format(id="__next"), "app-root"),
        (SHELL.format(id="app"), "app-root"),
        ("<html><body><app-root></app-root><script></script></body></html>", "app-root"),
        ("<body><noscript>Please enable JavaScript</noscript><div id=x>hi</div><script></script>",
         "noscript"),
        ("<body><script>document.write('x')</script></body>", "empty-body"),
        ("<body><div id='root'><article>" + "Server-rendered text. " * 20
         + "</article></div><script></script></body>", None),
        ("<body><p>" + "A real article with enough text. " * 5
         + "</p><script>track()</script></body>", None),
    ],
)  # fmt: skip
def test_script_built_signals(html: str, signal: str | None) -> None:
    assert rr.script_built(html.encode()) == signal


def test_the_sites_script_pages_are_detected() -> None:
    for path in ("/js/fetch", "/js/delayed", "/js/app/x", "/js/noscript", "/js/bench/1"):
        page = js_site.page(path)
        assert page is not None and rr.script_built(page[0].encode()) is not None, path


def _problems(actions: list[Any], wait_for: int = 0) -> list[dict[str, Any]]:
    return rr.parse_actions(actions, "$.actions", wait_for)[1]


def test_valid_actions_get_firecrawl_defaults() -> None:
    actions, problems = rr.parse_actions(
        [{"type": "wait", "milliseconds": 5}, {"type": "click", "selector": "#a"},
         {"type": "scroll"}, {"type": "screenshot"}, {"type": "pdf"}, {"type": "scrape"},
         {"type": "write", "text": "x"}, {"type": "press", "key": "Enter"},
         {"type": "executeJavascript", "script": "1"}],
        "$.actions",
    )  # fmt: skip
    assert problems == []
    click, scroll, shot, pdf = actions[1], actions[2], actions[3], actions[4]
    assert isinstance(click, rr.Click) and click.all is False
    assert isinstance(scroll, rr.Scroll) and scroll.direction == "down"
    assert isinstance(shot, rr.Screenshot) and shot.fullPage is False
    assert isinstance(pdf, rr.Pdf) and (pdf.format, pdf.landscape, pdf.scale) == (
        "Letter",
        False,
        1,
    )


@pytest.mark.parametrize(
    ("actions", "path", "text"),
    [
        ([{"type": "hover", "selector": "a"}], "$.actions[0].type", "unknown action type 'hover'"),
        ([{"selector": "a"}], "$.actions[0].type", "missing"),
        ([{"type": "wait"}], "$.actions[0]", "Either 'milliseconds' or 'selector'"),
        ([{"type": "wait", "milliseconds": 5, "selector": "a"}], "$.actions[0]", "but not both"),
        ([{"type": "click"}], "$.actions[0]", "invalid click action"),
        ([{"type": "click", "selector": "a", "bogus": 1}], "$.actions[0]", "bogus"),
        ([{"type": "wait", "milliseconds": 1}, {"type": "press", "key": "Hyper"}],
         "$.actions[1]", "unknown key"),
        ([{"type": "screenshot", "quality": 101}], "$.actions[0]", "quality"),
        ([{"type": "pdf", "format": "B5"}], "$.actions[0]", "format"),
        ([{"type": "scroll", "direction": "left"}], "$.actions[0]", "invalid scroll action"),
        ([{"type": "wait", "milliseconds": 40_000}] * 2, "$.actions", "cannot exceed 60 seconds"),
        ([{"type": "scrape"}] * 51, "$.actions", "cannot exceed 50"),
    ],
)  # fmt: skip
def test_invalid_actions_are_named(actions: list[Any], path: str, text: str) -> None:
    problems = _problems(actions)
    assert any(p["path"] == path and text in p["message"] for p in problems), problems


def test_wait_for_counts_towards_the_total() -> None:
    assert _problems([{"type": "wait", "milliseconds": 30_000}], wait_for=31_000)
    assert not _problems([{"type": "wait", "selector": "#a"}], wait_for=59_000)


def test_request_with_bad_action_is_a_400_naming_it() -> None:
    body = {"url": "https://example.com/", "actions": [{"type": "click", "selector": "a"},
                                                      {"type": "teleport"}]}  # fmt: skip
    with pytest.raises(BadRequest) as info:
        parse_scrape(msgspec.json.encode(body), browser=True)
    assert info.value.details[0]["path"] == "$.actions[1].type"
    with pytest.raises(BadRequest) as info:
        parse_scrape(msgspec.json.encode({**body, "actions": body["actions"][:1]}))
    assert "[crawl.browser] is off" in info.value.details[0]["message"]


@pytest.mark.parametrize(
    ("formats", "spec", "problem"),
    [
        (["markdown"], None, None),
        (["screenshot"], rr.ScreenshotSpec(), None),
        (["screenshot@fullPage"], rr.ScreenshotSpec(full_page=True), None),
        ([{"type": "screenshot", "fullPage": True, "quality": 80,
           "viewport": {"width": 800, "height": 600}}],
         rr.ScreenshotSpec(full_page=True, quality=80, viewport=(800, 600)), None),
        ([{"type": "screenshot", "viewport": {"width": 5}}], None, "$.formats[0].viewport"),
        ([{"type": "screenshot", "zoom": 2}], None, "$.formats[0].zoom"),
        (["screenshot", "screenshot@fullPage"], rr.ScreenshotSpec(), "$.formats"),
    ],
)  # fmt: skip
def test_screenshot_formats(
    formats: list[Any], spec: rr.ScreenshotSpec | None, problem: str | None
) -> None:
    got, problems = rr.screenshot_spec(formats, "$")
    if problem is None:
        assert problems == [] and got == spec
    else:
        assert problems and problems[0]["path"] == problem


def test_browser_options_without_a_browser() -> None:
    options = msgspec.convert({"formats": ["screenshot"], "waitFor": 100}, ScrapeOptions)
    problems, warning = check_scrape_options(options, "$")
    assert problems[0]["path"] == "$.formats[0]" and "waitFor is ignored" in warning
    problems, warning = check_scrape_options(options, "$", browser=True)
    assert problems == [] and warning == ""


def test_wait_for_must_not_exceed_half_the_timeout() -> None:
    options = msgspec.convert({"waitFor": 3000, "timeout": 5000}, ScrapeOptions)
    problems, _ = check_scrape_options(options, "$", browser=True)
    assert problems[0] == {
        "path": "$.waitFor",
        "message": "waitFor must not exceed half of timeout",
    }


def test_page_plan_engine_reasons_and_languages() -> None:
    plan = page_plan(msgspec.convert({}, ScrapeOptions), 30.0)
    assert plan.forced == ()
    options = msgspec.convert(
        {"waitFor": 10, "mobile": True, "formats": ["screenshot"],
         "actions": [{"type": "scrape"}], "location": {"languages": ["de-DE", "en"]},
         "timeout": 9000},
        ScrapeOptions,
    )  # fmt: skip
    plan = page_plan(options, 30.0)
    assert plan.forced == ("waitFor", "actions", "screenshot", "mobile")
    assert plan.timeout == 9.0 and plan.spec.languages == ("de-DE", "en")
    assert plan.headers["Accept-Language"] == "de-DE,en;q=0.9"


@pytest.mark.parametrize(
    ("languages", "header"),
    [(["fr"], "fr"), (["de-CH", "de", "en"], "de-CH,de;q=0.9,en;q=0.8")],
)
def test_accept_language(languages: list[str], header: str) -> None:
    assert rr.accept_language(languages) == header


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ("net::ERR_NAME_NOT_RESOLVED", "SCRAPE_DNS_RESOLUTION_ERROR"),
        ("net::ERR_CERT_AUTHORITY_INVALID", "SCRAPE_SSL_ERROR"),
        ("net::ERR_TIMED_OUT", "SCRAPE_TIMEOUT"),
        ("net::ERR_SOCKS_CONNECTION_FAILED", "SCRAPE_SITE_ERROR"),
    ],
)
def test_navigation_errors(error: str, code: str) -> None:
    assert rr.navigation_error_code(error) == code


def test_mobile_user_agent_keeps_the_version() -> None:
    desktop = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/156.0.8078.114 Safari"
    assert "Chrome/156.0.0.0 Mobile" in rr.mobile_user_agent(desktop)
