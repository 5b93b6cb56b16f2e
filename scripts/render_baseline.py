"""The rendering benchmark's floors: a minimal DevTools client of its own (the standard library
only, nothing from crawld), run in its own process. It drives the same Chromium over
`--remote-debugging-pipe` with the same number of tabs and renders the given URLs:
navigate, wait for `load`, read the DOM as HTML. Three ways:

- `fresh`: a new browser context (and so a new tab and renderer) per page, disposed after it:
  the isolation a scrape is owed, paid in full;
- `reuse`: `TABS` tabs made once, each in a window of its own, each navigating to page after
  page: no isolation at all, the fastest a client can drive this browser for pages that are
  shown (the floor crawld's isolated rendering is held to);
- `reuse-background`: the same tabs opened in one window (this floor's earlier form, kept for
  comparison): Chromium shows only a window's active tab, so all but one render as hidden
  background tabs (no painting, no animation frames): less work than a scrape's page, whose
  tab is shown.

Prints a JSON line: pages, seconds, peak memory (PSS) of itself and the browser (MiB), the CPU
seconds the client and the browser used while the clock ran, and how many pages were visible
(`document.visibilityState`) when read.

    python scripts/render_baseline.py {fresh,reuse,reuse-background} EXECUTABLE TABS URL...
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--remote-debugging-pipe",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-background-timer-throttling",
    "--disable-backgrounding-occluded-windows",
    "--disable-renderer-backgrounding",
    "--mute-audio",
    "--hide-scrollbars",
    "--password-store=basic",
]
HTML = "[document.documentElement.outerHTML, document.visibilityState]"


def _pss(entry: Path, page: int) -> int:
    try:
        for line in (entry / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int((entry / "statm").read_text().split()[1]) * page


def _tree(root: int, value: Callable[[Path, list[str]], float]) -> tuple[float, float]:
    """`value(entry, stat fields after the name)` of process `root`, and its sum over all of
    `root`'s descendants, read from /proc once."""
    children: dict[int, list[int]] = {}
    values: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            values[int(entry.name)] = value(entry, fields)
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0.0, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        total += values.get(pid, 0.0)
        todo += children.get(pid, [])
    return values.get(root, 0.0), total


def tree_rss(root: int) -> int:
    """Memory of `root` and all its descendants: the sum of their PSS (shared pages split among
    the processes sharing them, so Chromium's code is counted once), in bytes."""
    page = os.sysconf("SC_PAGE_SIZE")
    own, descendants = _tree(root, lambda entry, _: _pss(entry, page))
    return int(own + descendants)


def tree_cpu(root: int) -> tuple[float, float]:
    """CPU seconds (user and system, with the children each process reaped) of `root` alone and
    of all its descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    return _tree(root, lambda _, fields: sum(int(f) for f in fields[11:15]) / tick)


class Cdp:
    """JSON messages ending in NUL: commands to the browser's fd 3, answers and events from
    its fd 4 (read in a thread, handed to the event loop)."""

    def __init__(self, write_fd: int, read_fd: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.write = os.fdopen(write_fd, "wb", buffering=0)
        self.ids = itertools.count(1)
        self.calls: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.loads: dict[str, asyncio.Event] = {}
        self.visible = 0
        threading.Thread(target=self._read, args=(read_fd,), daemon=True).start()

    def _read(self, fd: int) -> None:
        buffer = b""
        with os.fdopen(fd, "rb", buffering=0) as pipe, contextlib.suppress(RuntimeError):
            # RuntimeError: the loop is closed (the run is over, the browser closing)
            while chunk := pipe.read(1 << 16):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for raw in messages:
                    self.loop.call_soon_threadsafe(self._dispatch, json.loads(raw))
            self.loop.call_soon_threadsafe(self._closed)

    def _closed(self) -> None:
        for future in self.calls.values():
            future.set_exception(RuntimeError("the browser closed its pipe"))
        self.calls.clear()

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message:
            future = self.calls.pop(message["id"])
            if "error" in message:
                future.set_exception(RuntimeError(str(message["error"])))
            else:
                future.set_result(message.get("result", {}))
        elif message.get("method") == "Page.loadEventFired":
            event = self.loads.get(message.get("sessionId", ""))
            if event is not None:
                event.set()

    async def call(self, method: str, session: str = "", **params: Any) -> dict[str, Any]:
        ident = next(self.ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        future = self.calls[ident] = self.loop.create_future()
        self.write.write(json.dumps(message).encode() + b"\0")
        return await future

    async def open_tab(self, context: str = "", window: bool = False) -> str:
        params: dict[str, Any] = {"browserContextId": context} if context else {}
        if window:
            params["newWindow"] = True
        target = await self.call("Target.createTarget", url="about:blank", **params)
        attached = await self.call(
            "Target.attachToTarget", targetId=target["targetId"], flatten=True
        )
        session = str(attached["sessionId"])
        self.loads[session] = asyncio.Event()
        await self.call("Page.enable", session)
        return session

    async def load(self, session: str, url: str) -> str:
        loaded = self.loads[session]
        loaded.clear()
        await self.call("Page.navigate", session, url=url)
        await loaded.wait()
        answer = await self.call("Runtime.evaluate", session, expression=HTML, returnByValue=True)
        html, visibility = answer["result"]["value"]
        assert "<h1>" in html, html[:200]
        self.visible += visibility == "visible"
        return html


async def render(cdp: Cdp, mode: str, tabs: int, urls: list[str], start: Any) -> None:
    """Render `urls`; `start()` when the clock starts (reuse: once its tabs are open)."""
    queue = list(reversed(urls))
    done = 0

    async def fresh() -> None:
        nonlocal done
        while queue:
            url = queue.pop()
            context = (await cdp.call("Target.createBrowserContext"))["browserContextId"]
            session = await cdp.open_tab(context)
            await cdp.load(session, url)
            await cdp.call("Target.disposeBrowserContext", browserContextId=context)
            cdp.loads.pop(session)
            done += 1

    async def reuse(session: str) -> None:
        nonlocal done
        while queue:
            await cdp.load(session, queue.pop())
            done += 1

    if mode == "fresh":
        start()
        await asyncio.gather(*(fresh() for _ in range(tabs)))
    else:
        sessions = [await cdp.open_tab(window=mode == "reuse") for _ in range(tabs)]
        start()  # the tabs are made before the clock starts: reuse's best case
        await asyncio.gather(*(reuse(s) for s in sessions))


def launch(executable: str, udd: str) -> tuple[subprocess.Popen[bytes], int, int]:
    """Chromium with DevTools on its fds 3 and 4: (process, fd writing to 3, fd reading 4)."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    # High, close-on-exec copies for the child to dup2 onto 3 and 4 (no collision possible).
    child_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
    child_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(to_child_r)
    os.close(from_child_w)
    args = [executable, *FLAGS, f"--user-data-dir={udd}"]
    if os.geteuid() == 0:
        args.append("--no-sandbox")

    def fds() -> None:
        os.dup2(child_r, 3)
        os.dup2(child_w, 4)

    browser = subprocess.Popen(
        [*args, "about:blank"], preexec_fn=fds, close_fds=False,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(child_r)
    os.close(child_w)
    return browser, to_child_w, from_child_r


async def drive(
    write_fd: int, read_fd: int, mode: str, tabs: int, urls: list[str]
) -> dict[str, float]:
    """Render `urls`: the seconds it took, the CPU seconds of this client and of the browser."""
    cdp = Cdp(write_fd, read_fd)
    await cdp.call("Browser.getVersion")
    marks: list[tuple[float, tuple[float, float]]] = []

    def start() -> None:
        marks.append((time.perf_counter(), tree_cpu(os.getpid())))

    await render(cdp, mode, tabs, urls, start)
    (t0, (own0, kids0)), t1, (own1, kids1) = marks[0], time.perf_counter(), tree_cpu(os.getpid())
    await cdp.call("Browser.close")
    return {
        "seconds": t1 - t0, "client_cpu": own1 - own0, "browser_cpu": kids1 - kids0,
        "visible": cdp.visible,
    }  # fmt: skip


def main() -> None:
    mode, executable, tabs, urls = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    assert mode in ("fresh", "reuse", "reuse-background"), mode
    peak = 0
    stop = threading.Event()

    def sample(pid: int) -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_rss(pid))
            time.sleep(0.1)

    udd = tempfile.mkdtemp(prefix="render-baseline-")
    browser, write_fd, read_fd = launch(executable, udd)
    sampler = threading.Thread(target=sample, args=(os.getpid(),), daemon=True)
    sampler.start()
    try:
        timed = asyncio.run(drive(write_fd, read_fd, mode, tabs, urls))
        browser.wait(10)
    finally:
        stop.set()
        sampler.join()
        browser.kill()
        shutil.rmtree(udd, ignore_errors=True)
    print(json.dumps({"pages": len(urls), **timed, "peak_mib": peak / 2**20}))


if __name__ == "__main__":
    main()
