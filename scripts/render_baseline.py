"""The rendering benchmark's baseline: a minimal Playwright script, run in its own process with
its own interpreter (a virtualenv with `playwright`; crawld does not depend on it) and importing
nothing from crawld. It renders the same URLs with the same Chromium and the same number of tabs
as crawld: one fresh browser context per page (the isolation crawld gives each page), `goto`
until `load`, then the DOM as HTML. Prints a JSON line: pages, seconds, peak memory (PSS) of itself,
its Node driver and the browser (MiB).

    python scripts/render_baseline.py EXECUTABLE TABS URL [URL...]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path


def _pss(entry: Path, page: int) -> int:
    try:
        for line in (entry / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int((entry / "statm").read_text().split()[1]) * page


def tree_rss(root: int) -> int:
    """Memory of `root` and all its descendants: the sum of their PSS (shared pages split among
    the processes sharing them, so Chromium's code is counted once), in bytes."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            rss[int(entry.name)] = _pss(entry, page)
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


async def main() -> None:
    from playwright.async_api import async_playwright

    executable, tabs, urls = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_rss(os.getpid()))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=executable, args=args)
        queue: asyncio.Queue[str] = asyncio.Queue()
        for url in urls:
            queue.put_nowait(url)
        done = 0

        async def worker() -> None:
            nonlocal done
            while not queue.empty():
                url = queue.get_nowait()
                context = await browser.new_context()
                page = await context.new_page()
                await page.goto(url, wait_until="load")
                html = await page.content()
                assert "<h1>" in html
                await context.close()
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(tabs)))
        seconds = time.perf_counter() - t0
        await browser.close()
    stop.set()
    sampler.join()
    print(json.dumps({"pages": done, "seconds": seconds, "peak_mib": peak / 2**20}))


if __name__ == "__main__":
    asyncio.run(main())
