# What the browser engine decides without a browser: which engine renders a page, whether an
# HTTP answer looks script-built, Firecrawl's action schema (apps/api/src/controllers/v2/types.ts:
# the same action types, fields, defaults and limits, checked one action at a time so a 400 names
# the action), the screenshot format, device and language settings. Pure functions over plain
# values, tested with tables; daemon/crawl/rendering/render.py carries them out over CDP.
from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from daemon.crawl.problems import problem

__all__ = [
    "MAX_ACTIONS",
    "Action",
    "ScreenshotSpec",
    "browser_reasons",
    "parse_actions",
    "screenshot_spec",
    "script_built",
]

MAX_ACTIONS = 50
MAX_TOTAL_WAIT_MS = 60_000
SELECTOR_WAIT_COUNTS_MS = 1000
"""A `wait` for a selector counts as one second towards the 60 s total (as Firecrawl)."""

DESKTOP_VIEWPORT = (1920, 1080)
MOBILE_VIEWPORT = (412, 915)
MOBILE_SCALE = 2.0
PAPER_INCHES = {
    "A0": (33.1, 46.8), "A1": (23.4, 33.1), "A2": (16.54, 23.4), "A3": (11.7, 16.54),
    "A4": (8.27, 11.7), "A5": (5.83, 8.27), "A6": (4.13, 5.83), "Letter": (8.5, 11.0),
    "Legal": (8.5, 14.0), "Tabloid": (11.0, 17.0), "Ledger": (17.0, 11.0),
}  # fmt: skip

# Keys `press` knows beyond single characters: (code, windowsVirtualKeyCode, text typed).
KEYS: dict[str, tuple[str, int, str]] = {
    "Enter": ("Enter", 13, "\r"),
    "Tab": ("Tab", 9, ""),
    "Escape": ("Escape", 27, ""),
    "Backspace": ("Backspace", 8, ""),
    "Delete": ("Delete", 46, ""),
    "Space": ("Space", 32, " "),
    " ": ("Space", 32, " "),
    "ArrowUp": ("ArrowUp", 38, ""),
    "ArrowDown": ("ArrowDown", 40, ""),
    "ArrowLeft": ("ArrowLeft", 37, ""),
    "ArrowRight": ("ArrowRight", 39, ""),
    "Home": ("Home", 36, ""),
    "End": ("End", 35, ""),
    "PageUp": ("PageUp", 33, ""),
    "PageDown": ("PageDown", 34, ""),
}


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class Wait(_Strict, tag="wait", tag_field="type"):
    milliseconds: int | None = None
    selector: str | None = None


class Click(_Strict, tag="click", tag_field="type"):
    selector: str
    all: bool = False


class Screenshot(_Strict, tag="screenshot", tag_field="type"):
    fullPage: bool = False
    quality: int | None = None
    viewport: dict[str, int] | None = None


class Write(_Strict, tag="write", tag_field="type"):
    text: str


class Press(_Strict, tag="press", tag_field="type"):
    key: str


class Scroll(_Strict, tag="scroll", tag_field="type"):
    direction: Literal["up", "down"] = "down"
    selector: str | None = None


class Scrape(_Strict, tag="scrape", tag_field="type"):
    pass


class ExecuteJavascript(_Strict, tag="executeJavascript", tag_field="type"):
    script: str


class Pdf(_Strict, tag="pdf", tag_field="type"):
    landscape: bool = False
    scale: float = 1.0
    format: str = "Letter"


Action = Wait | Click | Screenshot | Write | Press | Scroll | Scrape | ExecuteJavascript | Pdf
_BY_TYPE: dict[str, type[Any]] = {
    "wait": Wait, "click": Click, "screenshot": Screenshot, "write": Write, "press": Press,
    "scroll": Scroll, "scrape": Scrape, "executeJavascript": ExecuteJavascript, "pdf": Pdf,
}  # fmt: skip


def parse_actions(
    raw: list[Any] | None, path: str, wait_for: int = 0
) -> tuple[list[Action], list[dict[str, Any]]]:
    """Firecrawl's actions from a request: (actions, problems). Each problem names the action
    (`$.actions[2]`, its type) and what is wrong with it."""
    if not raw:
        return [], []
    problems: list[dict[str, Any]] = []
    actions: list[Action] = []
    if len(raw) > MAX_ACTIONS:
        problems.append(problem(path, f"Number of actions cannot exceed {MAX_ACTIONS}"))
    for i, item in enumerate(raw[: MAX_ACTIONS + 1]):
        where = f"{path}[{i}]"
        kind = item.get("type") if isinstance(item, dict) else None
        cls = _BY_TYPE.get(kind) if isinstance(kind, str) else None
        if cls is None:
            shown = repr(kind)[:40] if kind is not None else "missing"
            problems.append(
                problem(f"{where}.type", f"unknown action type {shown}; one of {list(_BY_TYPE)}")
            )
            continue
        try:
            action = msgspec.convert(item, cls)
        except msgspec.ValidationError as exc:
            problems.append(problem(where, f"invalid {kind} action: {exc}"))
            continue
        message = _check(action)
        if message:
            problems.append(problem(where, f"invalid {kind} action: {message}"))
            continue
        actions.append(action)
    total = wait_for + sum(
        (a.milliseconds or 0) if a.milliseconds else SELECTOR_WAIT_COUNTS_MS
        for a in actions
        if isinstance(a, Wait)
    )
    if total > MAX_TOTAL_WAIT_MS:
        problems.append(
            problem(path, "Total wait time (waitFor + wait actions) cannot exceed 60 seconds")
        )
    return actions, problems


def _check(action: Action) -> str | None:
    if isinstance(action, Wait):
        if (action.milliseconds is None) == (action.selector is None):
            return "Either 'milliseconds' or 'selector' must be provided, but not both."
        if action.milliseconds is not None and action.milliseconds < 1:
            return "milliseconds must be positive"
    elif isinstance(action, Screenshot):
        if action.quality is not None and not 1 <= action.quality <= 100:
            return "quality must be between 1 and 100"
        if action.viewport is not None:
            return _viewport_problem(action.viewport)
    elif isinstance(action, Press):
        if action.key not in KEYS and len(action.key) != 1:
            return f"unknown key {action.key[:30]!r}; a single character or one of {list(KEYS)}"
    elif isinstance(action, Pdf):
        if action.format not in PAPER_INCHES:
            return f"format must be one of {list(PAPER_INCHES)}"
        if not 0.1 <= action.scale <= 2:
            return "scale must be between 0.1 and 2"
    elif (
        isinstance(action, Click | Scroll)
        and action.selector is not None
        and not action.selector.strip()
    ):
        return "selector must not be empty"
    return None


def _viewport_problem(viewport: dict[str, Any]) -> str | None:
    width, height = viewport.get("width"), viewport.get("height")
    if set(viewport) - {"width", "height"}:
        return "viewport has only width and height"
    for value in (width, height):
        if type(value) is not int or not 100 <= value <= 7680:
            return "viewport width and height are integers between 100 and 7680"
    return None


class ScreenshotSpec(msgspec.Struct, frozen=True):
    full_page: bool = False
    quality: int | None = None
    viewport: tuple[int, int] | None = None


def screenshot_spec(
    formats: list[str | dict[str, Any]], path: str
) -> tuple[ScreenshotSpec | None, list[dict[str, Any]]]:
    """The screenshot a request's `formats` ask for (one at most, as Firecrawl)."""
    found: list[ScreenshotSpec] = []
    problems: list[dict[str, Any]] = []
    for i, fmt in enumerate(formats):
        name = fmt if isinstance(fmt, str) else fmt.get("type")
        if name == "screenshot@fullPage":
            found.append(ScreenshotSpec(full_page=True))
        elif name == "screenshot":
            if isinstance(fmt, str):
                found.append(ScreenshotSpec())
                continue
            extra = set(fmt) - {"type", "fullPage", "quality", "viewport"}
            where = f"{path}.formats[{i}]"
            if extra:
                problems.append(problem(f"{where}.{sorted(extra)[0]}", "unrecognized key"))
                continue
            full, quality, viewport = (
                fmt.get("fullPage", False),
                fmt.get("quality"),
                fmt.get("viewport"),
            )
            if not isinstance(full, bool):
                problems.append(problem(f"{where}.fullPage", "a boolean"))
                continue
            if quality is not None and (type(quality) is not int or not 1 <= quality <= 100):
                problems.append(problem(f"{where}.quality", "an integer between 1 and 100"))
                continue
            size = None
            if viewport is not None:
                message = (
                    _viewport_problem(viewport)
                    if isinstance(viewport, dict)
                    else "an object {width, height}"
                )
                if message:
                    problems.append(problem(f"{where}.viewport", message))
                    continue
                size = (int(viewport["width"]), int(viewport["height"]))
            found.append(ScreenshotSpec(full_page=full, quality=quality, viewport=size))
    if len(found) > 1:
        problems.append(problem(f"{path}.formats", "You may only specify one screenshot format"))
    return (found[0] if found else None), problems


def browser_reasons(
    *, wait_for: int, actions: int, screenshot: bool, mobile: bool | None
) -> list[str]:
    """Why a request can only be served by the browser (empty: HTTP may do)."""
    reasons = []
    if wait_for > 0:
        reasons.append("waitFor")
    if actions:
        reasons.append("actions")
    if screenshot:
        reasons.append("screenshot")
    if mobile:
        reasons.append("mobile")
    return reasons


# -- is this page built by scripts? ------------------------------------------------------------

APP_ROOT_IDS = ("root", "app", "__next", "__nuxt", "___gatsby", "svelte", "main-app")
APP_ROOT_MARKS = ("data-reactroot", "ng-app", "ng-version", "data-v-app", "data-server-rendered")
TEXT_THRESHOLD = 200
"""Characters of visible text (whitespace not counted) below which a page with scripts and an
app root counts as an empty shell."""
_SCRIPT = re.compile(rb"<script\b", re.I)
_BODY = re.compile(rb"<body\b", re.I)
_TOKEN = re.compile(
    rb"<(script|style|template|noscript|svg)\b.*?</\1\s*>|<!--.*?-->|<[^>]*>|([^<]+)", re.I | re.S
)
_SPACE = re.compile(rb"\s+")
_NOSCRIPT_JS = re.compile(rb"<noscript[^>]*>(?:(?!</noscript).){0,2000}?javascript", re.I | re.S)
# No tag context (`<div ... id=`): a literal-led alternation scans fast; a match in text is rare
# and costs only a render.
_APP_ROOT = re.compile(
    rb"<app-root\b|\sid\s*=\s*[\"']?(?:"
    + b"|".join(re.escape(i.encode()) for i in APP_ROOT_IDS)
    + rb")(?=[\"'\s>])|\s(?:"
    + b"|".join(re.escape(m.encode()) for m in APP_ROOT_MARKS)
    + rb")\b",
    re.I,
)


def visible_text_length(body: bytes, limit: int = 1 << 30) -> int:
    """Non-whitespace characters of the page's body outside scripts, styles, templates,
    noscript and svg (entities count as written), counted up to just past `limit`: a cheap
    measure, no parse, and a page with real text stops being scanned after its first lines."""
    start = _BODY.search(body)
    total = 0
    for match in _TOKEN.finditer(body, start.start() if start else 0):
        text = match.group(2)
        if text:
            total += len(_SPACE.sub(b"", text))
            if total > limit:
                break
    return total


def script_built(body: bytes) -> str | None:
    """Which signal says the HTML answer needs a browser, or None. Regular expressions over the
    bytes, no parse: plain pages must not pay for the check. Signals, in order:
    - no `<script>` at all: never;
    - `noscript`: a `<noscript>` asking for JavaScript, and under 1,000 characters of text;
    - `app-root`: an app mount point (id root, app, __next, __nuxt, ___gatsby, svelte, main-app;
      <app-root>; data-reactroot, ng-app, ng-version, data-v-app, data-server-rendered) and
      under TEXT_THRESHOLD characters of visible text;
    - `empty-body`: scripts and under 50 characters of visible text."""
    if not _SCRIPT.search(body):
        return None
    noscript = _NOSCRIPT_JS.search(body) is not None
    app_root = _APP_ROOT.search(body) is not None
    text = visible_text_length(body, 1000 if noscript else TEXT_THRESHOLD if app_root else 50)
    if text < 1000 and noscript:
        return "noscript"
    if text < TEXT_THRESHOLD and app_root:
        return "app-root"
    if text < 50:
        return "empty-body"
    return None


def mobile_user_agent(desktop: str) -> str:
    """The browser's own user agent as Chrome on Android says it."""
    match = re.search(r"Chrome/([\d.]+)", desktop)
    version = match.group(1).split(".")[0] + ".0.0.0" if match else "156.0.0.0"
    return (
        "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
        f"Chrome/{version} Mobile Safari/537.36"
    )


def accept_language(languages: list[str]) -> str:
    """`location.languages` as an Accept-Language value (q falling by 0.1)."""
    parts = []
    for i, lang in enumerate(languages[:10]):
        parts.append(lang if i == 0 else f"{lang};q={max(0.1, 1 - i / 10):.1f}")
    return ",".join(parts)


NET_ERRORS = {
    "net::ERR_NAME_NOT_RESOLVED": "SCRAPE_DNS_RESOLUTION_ERROR",
    "net::ERR_NAME_RESOLUTION_FAILED": "SCRAPE_DNS_RESOLUTION_ERROR",
    "net::ERR_SOCKS_CONNECTION_HOST_UNREACHABLE": "SCRAPE_DNS_RESOLUTION_ERROR",
    "net::ERR_TIMED_OUT": "SCRAPE_TIMEOUT",
    "net::ERR_CONNECTION_TIMED_OUT": "SCRAPE_TIMEOUT",
}


def navigation_error_code(error_text: str) -> str:
    """Firecrawl's code for a failed navigation (Chromium's net error text)."""
    if error_text in NET_ERRORS:
        return NET_ERRORS[error_text]
    if "CERT" in error_text or "SSL" in error_text:
        return "SCRAPE_SSL_ERROR"
    return "SCRAPE_SITE_ERROR"
