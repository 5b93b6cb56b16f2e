# The supervised headless Chromium. One browser process at a time, driven over its DevTools pipe
# (daemon/crawl/rendering/cdp.py); each page gets a tab of a browser context of its own (cookies,
# storage and cache of its own), at most `tabs` at once: a tab reused after a verified reset, or a
# new context (daemon/crawl/rendering/isolation.py).
#
# Lifetimes: the browser is replaced after `restart_after` pages or when its processes use more
# than `max_memory` (it first stops taking pages and finishes the ones it has; at 1.5x it is
# killed at once), and restarted with backoff after a crash. A crash fails only the pages it was
# rendering (every waiting DevTools call fails when the pipe closes). No Chromium outlives crawld:
# the browser runs in a process group of its own that is killed on stop, its main process gets
# PR_SET_PDEATHSIG=SIGKILL (set in the child before exec, from the trio thread: the signal follows
# the *thread* that forked, so the fork must not happen in a worker thread that may exit), and its
# other processes exit when the main one does. The user-data directory name carries crawld's pid,
# so a start after a crash of the whole machine's crawld kills browsers whose owner is gone.
#
# Network: everything goes through the VettingProxy (daemon/crawl/fetching/proxy.py). The
# host-resolver rules make the browser unable to resolve any name itself, QUIC is off and WebRTC may
# only use proxied TCP, so the proxy sees every connection a page can open.
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from daemon.crawl.config import BrowserConfig, find_browser
from daemon.crawl.rendering.cdp import CdpClosed, CdpError, Connection, Session
from daemon.crawl.rendering.isolation import Slot, Slots
from daemon.crawl.rendering.processes import (
    DIR_PREFIX,
    end_stale_browsers,
    group_rss,
    processes,
    stale_browsers,
)
from daemon.logs import get_logger

log = get_logger("crawl.browser")

__all__ = [
    "DIR_PREFIX",
    "Browser",
    "BrowserPool",
    "BrowserUnavailable",
    "browser_args",
    "end_stale_browsers",
    "stale_browsers",
]

START_SECONDS = 30.0
CLOSE_SECONDS = 5.0
MEMORY_CHECK_SECONDS = 2.0
_PR_SET_PDEATHSIG = 1
SPARE_CONTEXTS = 1
"""Contexts kept beyond `tabs`: a clean tab for the next page while one is being reset. Each
context renders in a renderer process of its own, whose first pages cost it about twice the CPU
of the later ones, so more spares make a fresh browser slower and bigger (`tabs` spares: 40
pages on a fresh browser cost 130-160 ms of its CPU a page against 90-115 with one, and 190 MiB
more; scripts/bench_render.py)."""


class BrowserUnavailable(Exception):
    """No browser could be started (or it died while a page waited for it)."""


def browser_args(
    user_data_dir: str, proxy_port: int, *, sandbox: bool, extra: tuple[str, ...] = ()
) -> list[str]:
    """Chromium's switches (after the executable): headless, DevTools on a pipe, no traffic of
    its own, and every connection through the SOCKS5 proxy on `proxy_port` (the proxy's closed
    port: the pages' browser contexts get the vetting one, see BrowserPool.tab)."""
    args = [
        "--headless",
        "--remote-debugging-pipe",
        f"--user-data-dir={user_data_dir}",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
        "--disable-default-apps",
        "--disable-extensions",
        "--disable-breakpad",
        "--disable-crash-reporter",
        "--disable-domain-reliability",
        "--disable-client-side-phishing-detection",
        "--disable-background-timer-throttling",
        "--disable-backgrounding-occluded-windows",
        "--disable-renderer-backgrounding",
        # RenderDocument: Chromium's new frame (and compositor) for every cross-document
        # navigation, where a same-site one could keep the last; a reused tab navigates twice
        # a page (the page, then the reset's blank page), and off, the browser's CPU a page went
        # from about 105 ms to 75 (scripts/bench_render.py). Each document is still a new one.
        "--disable-features=DnsOverHttps,OptimizationHints,MediaRouter,Translate,"
        "InterestFeedContentSuggestions,AutofillServerCommunication,"
        "CertificateTransparencyComponentUpdater,RenderDocument",
        "--metrics-recording-only",
        "--no-pings",
        "--mute-audio",
        "--hide-scrollbars",
        "--password-store=basic",
        "--use-mock-keychain",
        # The network: only through the vetting proxy, no name resolution of its own, no UDP.
        f"--proxy-server=socks5://127.0.0.1:{proxy_port}",
        "--proxy-bypass-list=<-loopback>",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
        "--webrtc-ip-handling-policy=disable_non_proxied_udp",
        # A browser context's next page of the same site reuses the renderer process of the
        # last (suitable processes only: same context, same site lock). Without it, each
        # navigation in a context crawld creates starts a new renderer, which costs more CPU
        # than the page (scripts/bench_render.py).
        "--renderer-process-limit=1",
    ]
    if not sandbox:
        args.append("--no-sandbox")
    return [*args, *extra, "about:blank"]


def browser_env(user_data_dir: str) -> dict[str, str]:
    """A clean environment: none of crawld's secrets, no Google API keys (Debian's launcher
    exports some, which turn on sign-in and other Google services), home and caches inside
    the throw-away user-data directory."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": user_data_dir,
        "TMPDIR": tempfile.gettempdir(),
        "XDG_CONFIG_HOME": os.path.join(user_data_dir, "config"),
        "XDG_CACHE_HOME": os.path.join(user_data_dir, "cache"),
        "GOOGLE_API_KEY": "no",
        "GOOGLE_DEFAULT_CLIENT_ID": "no",
        "GOOGLE_DEFAULT_CLIENT_SECRET": "no",
    }
    for name in ("LANG", "LC_ALL", "TZ", "FONTCONFIG_PATH"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def real_executable(path: str) -> str:
    """Debian's /usr/bin/chromium is a shell launcher that sources /etc/chromium.d (API keys,
    remote extensions, extra flags); crawld runs the binary it would exec instead."""
    try:
        with open(path, "rb") as file:
            head = file.read(4096)
    except OSError:
        return path
    if head.startswith(b"#!") and b"LIBDIR=/usr/lib/$APPNAME" in head:
        name = os.path.basename(path)
        binary = os.path.join("/usr/lib", name, name)
        if os.access(binary, os.X_OK):
            return binary
    return path


def _libc_prctl() -> Callable[[int, int], int] | None:
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda option, arg: int(prctl(option, arg, 0, 0, 0))


_prctl = _libc_prctl()


def _child_setup(read_fd: int, write_fd: int, parent: int) -> Callable[[], None]:
    def setup() -> None:  # runs in the child between fork and exec
        os.dup2(read_fd, 3)
        os.dup2(write_fd, 4)
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl: do not outlive it
            os._exit(1)

    return setup


@dataclass
class Browser:
    """One running Chromium."""

    process: subprocess.Popen[bytes]
    conn: Connection
    user_data_dir: str
    pages: int = 0
    active: int = 0
    retiring: bool = False
    user_agent: str = ""
    slots: Slots | None = None
    drained: trio.Event = field(default_factory=trio.Event)
    exited: trio.Event = field(default_factory=trio.Event)

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL to its process group and to the helpers that left it (crash handlers
        detach into groups of their own; their arguments name the user-data directory)."""
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for pid in processes(Path("/proc"), self.user_data_dir):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def rss(self) -> int:
        return group_rss(self.process.pid)


def _spawn(
    executable: str, proxy_port: int, sandbox: bool, serial: int
) -> tuple[subprocess.Popen[bytes], str, int, int]:
    """Fork and exec Chromium on this (the trio) thread: (process, user-data dir, the fd that
    writes to its fd 3, the fd that reads its fd 4). A fork takes a few milliseconds."""
    udd = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-{serial}-")
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    # High, close-on-exec copies for the child to dup2 onto 3 and 4 (no collision possible).
    child_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
    child_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(to_child_r)
    os.close(from_child_w)
    try:
        with open(os.path.join(udd, "stderr.log"), "wb") as stderr:
            process = subprocess.Popen(
                [executable, *browser_args(udd, proxy_port, sandbox=sandbox)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                close_fds=False,  # only inheritable fds pass: 0-2 and the dup2'd 3 and 4
                preexec_fn=_child_setup(child_r, child_w, os.getpid()),
                start_new_session=True,
                env=browser_env(udd),
            )
    except OSError as exc:
        for fd in (to_child_w, from_child_r):
            os.close(fd)
        shutil.rmtree(udd, ignore_errors=True)
        raise BrowserUnavailable(f"cannot start {executable}: {exc}") from None
    finally:
        os.close(child_r)
        os.close(child_w)
    return process, udd, to_child_w, from_child_r


async def launch(
    executable: str, proxy_port: int, *, sandbox: bool, nursery: trio.Nursery, serial: int
) -> Browser:
    """Start Chromium and wait until it answers on its pipe."""
    process, udd, to_child_w, from_child_r = _spawn(executable, proxy_port, sandbox, serial)
    conn = Connection(trio.lowlevel.FdStream(to_child_w), trio.lowlevel.FdStream(from_child_r))
    browser = Browser(process, conn, udd)
    nursery.start_soon(conn.run)
    nursery.start_soon(_watch_exit, browser)
    try:
        with trio.fail_after(START_SECONDS):
            version = await conn.call("Browser.getVersion")
    except (CdpClosed, CdpError, trio.TooSlowError) as exc:
        browser.kill()
        tail = _stderr_tail(udd)
        raise BrowserUnavailable(f"{executable} did not start: {exc}; {tail}") from None
    browser.user_agent = str(version.get("userAgent", "")).replace("HeadlessChrome", "Chrome")
    log.info("browser started", pid=process.pid, version=version.get("product", "?"))
    return browser


def _stderr_tail(udd: str) -> str:
    try:
        text = Path(udd, "stderr.log").read_text(errors="replace")
    except OSError:
        return "no output"
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-600:] or "no output"


async def _watch_exit(browser: Browser) -> None:
    try:
        fd = os.pidfd_open(browser.process.pid)
    except OSError:
        fd = None
    try:
        if fd is not None:
            await trio.lowlevel.wait_readable(fd)
        else:  # pragma: no cover - kernels without pidfd
            await trio.to_thread.run_sync(browser.process.wait, abandon_on_cancel=True)
        browser.process.wait()
    finally:
        if fd is not None:
            os.close(fd)
        browser.kill()  # the rest of its process group
        browser.exited.set()


@dataclass
class Tab:
    """A page of its own browser context, attached to a flat session, its Page and Network
    domains enabled. A render that changes a page setting adds its key (isolation.UNDO) to
    `changed`, so that it is undone before the tab serves another page."""

    session: Session
    browser: Browser
    context_id: str
    changed: set[str]
    applied: dict[str, Any]
    """Device metrics and user agent as last set in this tab (a render skips setting them
    again)."""


class BrowserPool:
    """Keeps one browser running and hands out tabs; `run` is the supervising task."""

    def __init__(
        self,
        config: BrowserConfig,
        proxy_port: Callable[[], int],
        closed_port: Callable[[], int] | None = None,
        stealth_port: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self._stealth_port = stealth_port
        executable = find_browser(config.executable)
        if executable is None:
            raise BrowserUnavailable("no browser found (see [crawl.browser] executable)")
        self.executable = real_executable(executable)
        self._proxy_port = proxy_port
        self._closed_port = closed_port or proxy_port
        self._tabs = trio.CapacityLimiter(config.tabs)
        self._current: Browser | None = None
        self._ready = trio.Event()
        self._stopping = False
        self._nursery: trio.Nursery | None = None
        self.counts: dict[str, int] = {"started": 0, "crashed": 0, "recycled": 0, "pages": 0}
        self.last_error = ""

    # -- supervising ----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(end_stale_browsers)
        backoff = 0.5
        serial = 0
        started = False
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                while True:
                    serial += 1
                    try:
                        browser = await launch(
                            self.executable, self._closed_port(),
                            sandbox=self.config.use_sandbox(), nursery=nursery, serial=serial,
                        )  # fmt: skip
                    except BrowserUnavailable as exc:
                        self.last_error = str(exc)
                        if not started:
                            raise
                        log.error("browser did not start; retrying", error=str(exc))
                        await trio.sleep(backoff)
                        backoff = min(backoff * 2, 30.0)
                        continue
                    browser.slots = Slots(
                        browser.conn, keep=self.config.tabs + SPARE_CONTEXTS,
                        pages_per_context=self.config.pages_per_context,
                    )  # fmt: skip
                    try:
                        await browser.slots.watch()
                    except (CdpClosed, CdpError) as exc:
                        log.error("browser does not report its targets", error=str(exc))
                        browser.kill()
                    nursery.start_soon(
                        browser.slots.prewarm, self._proxy_port(), browser.slots.keep
                    )
                    self.counts["started"] += 1
                    self._current = browser
                    self._ready.set()
                    if not started:
                        started = True
                        task_status.started()
                    born = trio.current_time()
                    reason = await self._watch(browser)
                    self._not_ready()
                    self._current = None
                    if reason == "crashed":
                        self.counts["crashed"] += 1
                        output = _stderr_tail(browser.user_data_dir)
                        log.error("browser exited; restarting", pid=browser.pid,
                                  pages=browser.pages, output=output)  # fmt: skip
                        if trio.current_time() - born < 10:
                            await trio.sleep(backoff)
                            backoff = min(backoff * 2, 30.0)
                        else:
                            backoff = 0.5
                    else:
                        self.counts["recycled"] += 1
                        log.info("browser replaced", reason=reason, pages=browser.pages)
                    await self._close(browser)
        finally:
            self._stopping = True
            with trio.CancelScope(shield=True):
                if self._current is not None:
                    await self._close(self._current)
                    self._current = None

    async def _watch(self, browser: Browser) -> str:
        """Until the browser must go: "crashed", "pages" (restart_after) or "memory"."""
        cap = self.config.max_memory
        while True:
            with trio.move_on_after(MEMORY_CHECK_SECONDS):
                async with trio.open_nursery() as race:

                    async def exited() -> None:
                        await browser.exited.wait()
                        race.cancel_scope.cancel()

                    async def drained() -> None:
                        await browser.drained.wait()
                        race.cancel_scope.cancel()

                    race.start_soon(exited)
                    race.start_soon(drained)
            if browser.exited.is_set() or browser.conn.closed.is_set():
                return "crashed"
            if browser.drained.is_set():
                return "memory" if browser.pages < self.config.restart_after else "pages"
            rss = await trio.to_thread.run_sync(browser.rss)
            if rss > cap * 1.5:
                log.warning("browser over 1.5x max_memory; killing it", rss=rss, cap=cap)
                browser.kill()
                await browser.exited.wait()
                return "memory"
            if rss > cap and not browser.retiring:
                log.info("browser over max_memory; replacing it after its pages", rss=rss)
                self._retire(browser)

    def _not_ready(self) -> None:
        # Tabs waiting for a browser wait on the current event: replace it only once it fired.
        if self._ready.is_set():
            self._ready = trio.Event()

    def _retire(self, browser: Browser) -> None:
        browser.retiring = True
        if self._current is browser:
            self._not_ready()
        if browser.active == 0:
            browser.drained.set()

    async def _close(self, browser: Browser) -> None:
        with trio.move_on_after(CLOSE_SECONDS):
            with contextlib.suppress(CdpClosed, CdpError):
                await browser.conn.call("Browser.close")
            await browser.exited.wait()
        browser.kill()
        with trio.move_on_after(CLOSE_SECONDS):
            await browser.exited.wait()
        await trio.to_thread.run_sync(
            functools.partial(shutil.rmtree, browser.user_data_dir, ignore_errors=True),
            abandon_on_cancel=True,
        )

    # -- tabs ------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def tab(self, *, stealth: bool = False) -> AsyncIterator[Tab]:
        """A clean tab of a browser context of its own (see isolation.py), given back after
        the block (reset in the background, or its context disposed); `stealth`: its
        connections leave through the stealth proxy pool (when configured)."""
        port = self._stealth_port() if stealth and self._stealth_port else self._proxy_port()
        async with self._tabs:
            browser = await self._browser()
            assert browser.slots is not None
            browser.active += 1
            slot: Slot | None = None
            ok = False
            try:
                slot = await browser.slots.take(port)
                yield Tab(slot.session, browser, slot.context_id, slot.changed, slot.applied)
                ok = True
            finally:
                if slot is not None:
                    self._give_back(browser, slot, ok)
                browser.active -= 1
                browser.pages += 1
                self.counts["pages"] += 1
                if browser.pages >= self.config.restart_after and not browser.retiring:
                    self._retire(browser)
                if browser.retiring and browser.active == 0:
                    browser.drained.set()

    def _give_back(self, browser: Browser, slot: Slot, ok: bool) -> None:
        assert browser.slots is not None
        give_back = functools.partial(browser.slots.give_back, slot, ok, functools.partial(
            self._stalled, browser))  # fmt: skip
        if self._nursery is not None and not browser.retiring:
            self._nursery.start_soon(give_back)
        else:  # the browser is going: nothing to keep, and its close disposes of everything
            browser.slots.live.pop(slot.context_id, None)
            browser.conn.forget(slot.session.id)

    def _stalled(self, browser: Browser) -> None:
        log.error("browser does not close a tab; killing it", pid=browser.pid)
        browser.kill()

    async def _browser(self) -> Browser:
        while True:
            if self._stopping:
                raise BrowserUnavailable("the browser is stopping")
            current = self._current
            if current is not None and not current.retiring and not current.exited.is_set():
                return current
            with trio.move_on_after(START_SECONDS * 2):
                await self._ready.wait()
                continue
            raise BrowserUnavailable(f"no browser is running: {self.last_error or 'starting'}")

    def status(self) -> dict[str, Any]:
        current = self._current
        return {
            "executable": self.executable,
            "pid": current.pid if current else None,
            "pages_this_process": current.pages if current else 0,
            "tabs_busy": int(self._tabs.borrowed_tokens),
            "tabs": self.config.tabs,
            "tabs_idle": len(current.slots.idle) if current and current.slots else 0,
            **self.counts,
        }
