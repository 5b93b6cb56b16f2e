# The `[crawl]` section: the Firecrawl-compatible scrape/crawl/map API (issue 10). Limits apply to
# jobs started after a reload; running jobs keep the values they started with.
#
# `[crawl.browser] enabled` is "auto" by default: the browser is used where it can run (a
# Chromium on PATH) and is off elsewhere, so screenshots work without a config edit on a machine
# that has Chromium. `sandbox` is "auto" too: Chromium's sandbox cannot start as root, so a root
# crawld (a container, a test machine) runs it without and says so in /status and the log; the
# systemd unit runs crawld as a user, where the sandbox is on. What it comes to depends on the
# machine, not only on the file, so it is worked out apart (BrowserConfig.choice) from the value
# checks, and `true` is checked against the machine with the other references when the file is read.
from __future__ import annotations

import ipaddress
import os
import shutil
from typing import Any, Literal

import msgspec

from daemon.config_types import Duration, Section
from daemon.crawl.proxies import ProxyServer, proxy_problems

BROWSER_NAMES = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome")
"""Looked up on PATH, in this order, when `[crawl.browser] executable` is empty."""


def find_browser(executable: str) -> str | None:
    """The browser's path: `executable` itself (a path or a name on PATH), else the first of
    BROWSER_NAMES on PATH; None when there is none."""
    if executable:
        if os.sep in executable:
            return executable if os.access(executable, os.X_OK) else None
        return shutil.which(executable)
    for name in BROWSER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserChoice(msgspec.Struct, frozen=True, omit_defaults=True):
    """What `[crawl.browser] enabled` comes to on this machine (`/status` → `crawl.browser`)."""

    mode: Literal["auto", "on", "off"]
    """The file's value: "auto", "on" (true) or "off" (false)."""
    enabled: bool
    """The browser is started and used."""
    binary: str | None = None
    """The Chromium found (with "auto" or true)."""
    sandbox: bool | None = None
    """Chromium runs in its own sandbox (when enabled)."""
    reason: str | None = None
    """Why it is off (not enabled)."""

    def status(self) -> dict[str, Any]:
        return dict(msgspec.to_builtins(self))


class BrowserConfig(Section, frozen=True):
    """`[crawl.browser]`: the headless Chromium that renders pages needing JavaScript."""

    enabled: bool | Literal["auto"] = "auto"
    """"auto": use Debian's `chromium` when one is found on PATH (and can use its sandbox),
    else off; true: start and supervise it (a start-up error without one); false: HTTP only."""
    executable: str = ""
    """Path or name of the browser; empty: the first of chromium, chromium-headless-shell,
    chromium-browser, google-chrome found on PATH."""
    tabs: int = 4
    """Pages rendered at once."""
    max_memory: int = 2 * 1024 * 1024 * 1024
    """Bytes of memory (PSS: shared pages split) of all the browser's processes; above it the
    browser is restarted once its pages finish (at 1.5x it is killed at once, its pages fail)."""
    restart_after: int = 500
    """Pages rendered by one browser process before it is replaced by a fresh one."""
    pages_per_context: int = 50
    """Pages one tab (a browser context of its own) renders before its context is disposed;
    between two, the tab is reset and the reset checked (cookies, storage, caches, service
    workers, permissions, history), or the context disposed when it cannot be. 1: a new context
    for every page (several times slower)."""
    sandbox: bool | Literal["auto"] = "auto"
    """Chromium's own sandbox. It cannot run as root: "auto" uses it unless crawld runs as root
    (then without, with a warning); true: always (as root, a start-up error); false: never (a
    container that is itself the sandbox)."""
    max_screenshot_height: int = 16384
    """Tallest full-page screenshot in CSS pixels (longer pages are cut)."""

    def __post_init__(self) -> None:
        if self.tabs < 1 or self.restart_after < 1 or self.pages_per_context < 1:
            raise ValueError("tabs, restart_after and pages_per_context must be at least 1")
        if self.max_memory < 64 * 1024 * 1024:
            raise ValueError("max_memory must be at least 64 MiB (67108864)")

    def choice(self) -> BrowserChoice:
        """Whether the browser is used here: looks for it on PATH (or at `executable`) and at
        who runs crawld. With `enabled = true` it is used whatever is found (check() refused
        the file already if it cannot run)."""
        if self.enabled is False:
            return BrowserChoice(mode="off", enabled=False, reason="enabled = false")
        binary = find_browser(self.executable)
        if self.enabled is True:
            return BrowserChoice(mode="on", enabled=True, binary=binary, sandbox=self.use_sandbox())
        problem = self._problem(binary)
        if problem is not None:
            return BrowserChoice(mode="auto", enabled=False, binary=binary, reason=problem[1])
        return BrowserChoice(mode="auto", enabled=True, binary=binary, sandbox=self.use_sandbox())

    def use_sandbox(self) -> bool:
        """Whether Chromium is started in its sandbox: `sandbox`, with "auto" meaning "unless
        crawld runs as root"."""
        if self.sandbox == "auto":
            return os.geteuid() != 0
        return self.sandbox

    def check(self) -> None:
        """ValueError naming the key path when `enabled = true` and the browser cannot run on
        this machine (no browser found, or root with the sandbox on)."""
        if self.enabled is not True:
            return
        problem = self._problem(find_browser(self.executable))
        if problem is not None:
            key, text = problem
            raise ValueError(f"{text} - at `$.crawl.browser.{key}`")

    def _problem(self, binary: str | None) -> tuple[str, str] | None:
        """(key, why) the browser cannot run here; None: it can."""
        if binary is None:
            what = (
                repr(self.executable)
                if self.executable
                else "none of " + ", ".join(BROWSER_NAMES) + " is on PATH"
            )
            return "enabled", (
                f"no browser found ({what}); install Debian's chromium "
                "(apt-get install chromium) or set [crawl.browser] enabled = false"
            )
        if self.sandbox is True and os.geteuid() == 0:
            return "sandbox", (
                "Chromium cannot use its sandbox as root; run crawld as a user "
                "(systemd/crawld.service does) or set sandbox = false"
            )
        return None


class CacheConfig(Section, frozen=True):
    """`[crawl.cache]`: the document cache behind `maxAge` / `minAge` / `lockdown`
    (docs/how-to/cache.md), in the store, shared by every instance."""

    enabled: bool = True
    """Keep and serve documents; off: every scrape is live, `minAge` and `lockdown` are 404s
    (as a Firecrawl without its index)."""
    max_bytes: int = 512 * 1024 * 1024
    """Bytes of cached documents kept; above it the oldest go at the next prune."""
    max_entries: int = 100_000
    """Documents kept; above it the oldest go at the next prune."""
    max_age: Duration = Duration(30 * 86400)
    """Documents older than this are deleted at the next prune, whatever maxAge asks."""
    prune_every: Duration = Duration(60)
    """How often the bounds are applied."""

    def __post_init__(self) -> None:
        if self.max_bytes < 1024 * 1024:
            raise ValueError("max_bytes must be at least 1 MiB (1048576)")
        if self.max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if float(self.max_age) <= 0 or float(self.prune_every) <= 0:
            raise ValueError("max_age and prune_every must be more than 0")


MAX_WORKERS = 256
"""Most `content_workers` (a typo's thousand processes would be a config error, not a fork
storm)."""


class CrawlConfig(Section, frozen=True):
    enabled: bool = True
    """Serve /v2/scrape, /v2/crawl, /v2/batch/scrape and /v2/map."""
    user_agent: str = "crawld/0.1 (self-hosted Firecrawl-compatible crawler) FirecrawlAgent"
    """Names no homepage: crawld has none. Operators put their own contact in it (a URL or a
    mail address), so site owners can reach whoever runs the crawl."""
    """Sent with every fetch; robots.txt rules are matched for FirecrawlAgent/FireCrawlAgent."""
    concurrency: int = 16
    """Most pages fetched at once over all jobs (a paced job, with `delay` or robots.txt
    Crawl-delay, fetches one page at a time outside this limit)."""
    per_host_concurrency: int = 4
    """Most pages fetched at once from one host (a job's maxConcurrency may lower it)."""
    connect_timeout: Duration = Duration(10)
    page_timeout: Duration = Duration(30)
    """Whole-page budget when the request gives no `timeout`."""
    max_bytes: int = 10 * 1024 * 1024
    """Largest response body read from a page; bigger pages fail with an error."""
    allow_cidrs: list[str] = []
    """Private networks crawls may reach (e.g. "127.0.0.0/8"); refused otherwise (SSRF guard)."""
    default_limit: int = 10_000
    """`limit` of a crawl that gives none."""
    max_running_jobs: int = 8
    """Crawl and batch jobs running at once; later ones wait their turn."""
    content_workers: int | Literal["auto"] = 0
    """Worker processes turning fetched HTML pages into documents (parsing, main content,
    markdown, links) and reading PDFs' text layers, so the crawl uses every core: "auto" is the
    cores crawld may use (its CPU affinity); 0 or 1 does that work in the daemon's own process.
    Read at start."""
    render: Literal["auto", "always", "never"] = "auto"
    """With a browser: "auto" renders pages that ask for it (waitFor, actions, screenshot,
    mobile) or look script-built; "always" renders every HTML page; "never" only those that
    ask for it."""
    browser: BrowserConfig = BrowserConfig()
    cache: CacheConfig = CacheConfig()
    proxies: list[ProxyServer] = []
    """Outbound proxies every fetch and browser connection goes through (empty: direct)."""
    stealth_proxies: list[ProxyServer] = []
    """Second pool for `proxy: "stealth"`/`"enhanced"`, and for `"auto"` after a 401/403/429."""
    proxy_rotation: Literal["per_host", "per_request"] = "per_host"
    """per_host: one site's pages all go through one proxy; per_request: round robin."""

    def check_proxies(self) -> None:
        """ValueError naming the key path of the first bad proxy (run when the file is read:
        it checks the credential variables exist in this environment)."""
        problems = proxy_problems(self.proxies, "$.crawl.proxies") + proxy_problems(
            self.stealth_proxies, "$.crawl.stealth_proxies"
        )
        if problems:
            raise ValueError(problems[0])

    def __post_init__(self) -> None:
        for cidr in self.allow_cidrs:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"allow_cidrs: {cidr!r} is not a network") from None
        for name in ("concurrency", "per_host_concurrency", "max_running_jobs", "default_limit"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_bytes < 1024:
            raise ValueError("max_bytes must be at least 1024")
        if self.content_workers != "auto" and not 0 <= self.content_workers <= MAX_WORKERS:
            raise ValueError(f'content_workers must be "auto" or 0 to {MAX_WORKERS}')
        if not self.user_agent.strip() or any(c in self.user_agent for c in "\r\n"):
            raise ValueError("user_agent must be one non-empty line")


OCR_ENGINES = ("tesseract", "llm")


def find_ocr_engine(executable: str) -> str | None:
    """The OCR engine's path: `executable` (a path or a name on PATH), else `tesseract` on PATH;
    None when there is none."""
    name = executable or "tesseract"
    if os.sep in name:
        return name if os.access(name, os.X_OK) else None
    return shutil.which(name)


class OcrConfig(Section, frozen=True):
    """`[ocr]`: text of scanned PDF pages and images, read on this machine
    (docs/how-to/documents.md)."""

    enabled: Literal["auto"] | bool = "auto"
    """"auto": on when the engine is installed; true: required (a missing engine is a config
    error); false: off (scanned pages answer SCRAPE_PDF_OCR_REQUIRED)."""
    engine: Literal["tesseract", "llm"] = "tesseract"
    """The OCR backend: Debian's tesseract-ocr (Apache-2.0), run as a subprocess per page; or
    "llm": the [llm] provider's vision model, one page image per request."""
    llm_provider: str = ""
    """With engine = "llm": the [llm.providers] name to ask (empty: the default provider)."""
    executable: str = ""
    """Path or name of the engine; empty: `tesseract` on PATH."""
    languages: list[str] = msgspec.field(default_factory=lambda: ["eng"])
    """Tesseract language packs to read with (Debian's tesseract-ocr-<lang>), e.g.
    ["eng", "deu"]."""
    dpi: int = 300
    """Resolution PDF pages are rendered at for OCR."""
    max_pixels: int = 40_000_000
    """Largest page image OCR'd, in pixels: a bigger PDF page is rendered at a lower resolution,
    a bigger PNG/JPEG/WebP image is refused (TIFF: bounded by max_memory only)."""
    concurrency: int = 2
    """Pages OCR'd at once over all documents (each is one engine process)."""
    page_timeout: Duration = Duration(60)
    """Longest OCR of one page; past it the page's process is killed and the page fails."""
    document_timeout: Duration = Duration(600)
    """Longest OCR of one document's pages together."""
    max_memory: int = 1024 * 1024 * 1024
    """Bytes of address space one OCR process may take (its pages fail beyond)."""
    cache_bytes: int = 64 * 1024 * 1024
    """Bytes of OCR'd page text kept in memory by the file's SHA-256 (0: none)."""

    def active(self) -> bool:
        """OCR is served: enabled (or "auto") and the engine is installed."""
        if self.enabled is False:
            return False
        return find_ocr_engine(self.executable) is not None

    def __post_init__(self) -> None:
        if not 72 <= self.dpi <= 600:
            raise ValueError("dpi must be between 72 and 600")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.max_pixels < 1_000_000:
            raise ValueError("max_pixels must be at least 1000000")
        if self.max_memory < 128 * 1024 * 1024:
            raise ValueError("max_memory must be at least 128 MiB (134217728)")
        if float(self.page_timeout) <= 0 or float(self.document_timeout) <= 0:
            raise ValueError("page_timeout and document_timeout must be more than 0")
        if self.cache_bytes < 0:
            raise ValueError("cache_bytes must be at least 0")
        for lang in self.languages:
            if not lang or not all(c.isalnum() or c == "_" for c in lang):
                raise ValueError(f"languages: {lang!r} is not a tesseract language name")
        if not self.languages:
            raise ValueError("languages: at least one")

    def check(self) -> None:
        """ValueError naming the key path when `enabled = true` and the engine is not on this
        machine (checked when the file is read, with the other references)."""
        if (
            self.engine == "tesseract"
            and self.enabled is True
            and (find_ocr_engine(self.executable) is None)
        ):
            raise ValueError(
                f"no OCR engine found ({self.executable or 'tesseract'} is not on PATH); install "
                "Debian's tesseract-ocr and tesseract-ocr-eng (apt-get install tesseract-ocr "
                'tesseract-ocr-eng) or set enabled = "auto" - at `$.ocr.enabled`'
            )


class ParseConfig(Section, frozen=True):
    """`[parse]`: POST /v2/parse, files uploaded to be turned into documents."""

    enabled: bool = True
    """Serve POST /v2/parse and GET /v2/parse/formats."""
    max_bytes: int = 50 * 1024 * 1024
    """Largest uploaded file (Firecrawl's 50 MB); bigger uploads are a 413. Apart from
    [http] max_body, which /v2/parse does not use."""

    def __post_init__(self) -> None:
        if self.max_bytes < 1024:
            raise ValueError("max_bytes must be at least 1024")
