"""Content workers alone: documents/s of the generated site's pages made by N worker processes
(daemon/crawl/content/pool.py) next to the same pages made inline on the trio thread, as crawld
did before issue 36, in the same run; no HTTP and no store, so it shows how the pool scales
with its size and what a page costs the trio thread with and without it.

Each round runs every size once, inline first in odd rounds and last in even ones; 16 trio tasks
feed the pool as a crawl at concurrency 16 would. Figures: documents/s (medians of the rounds),
the ratio to inline, and the trio thread's CPU per document (what is left on the event loop:
pickling, the socket, scheduling).

Usage: .venv/bin/python scripts/bench_pool.py [--pages 2000] [--sizes 1,2,3,4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator

import trio

from daemon.crawl.content.document import DocumentOptions, scrape_page_of
from daemon.crawl.content.pool import PagePool
from daemon.crawl.fetching.fetch import FetchResult
from daemon.crawl.runs.service import PRELOAD
from daemon.fakes.site import SiteSim

TASKS = 16


def site_pages(count: int) -> list[FetchResult]:
    site = SiteSim(pages=count)
    return [page(f"http://site.test/pages/{i}", site._tree_page(i)) for i in range(count)]


def page(url: str, html: str) -> FetchResult:
    return FetchResult(
        requested_url=url, url=url, status_code=200, content_type="text/html; charset=utf-8",
        headers={}, body=html.encode(),
    )  # fmt: skip


async def make(pool: PagePool | None, pages: Iterator[FetchResult]) -> None:
    options = DocumentOptions()
    for page in pages:
        if pool is None:
            await trio.lowlevel.checkpoint()
            scrape_page_of(page, options, page.url, "bench")
        else:
            await pool.run(scrape_page_of, page, options, page.url, "bench")


async def one(size: int, pages: list[FetchResult]) -> tuple[float, float]:
    """(documents/s, trio-thread CPU ms per document) with `size` workers (0: inline)."""
    pool = PagePool(size, preload=PRELOAD) if size else None
    try:
        if pool is not None:  # started before the clock runs
            async with trio.open_nursery() as nursery:
                for _ in range(size):
                    nursery.start_soon(make, pool, iter(pages[:1]))
        shared = iter(pages)
        cpu, wall = time.thread_time(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(TASKS):
                nursery.start_soon(make, pool, shared)
        wall = time.perf_counter() - wall
        return len(pages) / wall, (time.thread_time() - cpu) * 1000 / len(pages)
    finally:
        if pool is not None:
            await pool.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--sizes", default="1,2,3,4", help="pool sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pages = site_pages(args.pages)
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[int, list[tuple[float, float]]] = {s: [] for s in [0, *sizes]}
    for r in range(args.rounds):
        order = [0, *sizes] if r % 2 == 0 else [*sizes, 0]
        for size in order:
            results[size].append(trio.run(one, size, pages))
            rate, cpu = results[size][-1]
            print(f"round {r + 1}: {size or 'inline'}: {rate:.0f} documents/s, "
                  f"trio thread {cpu:.3f} ms/document", flush=True)  # fmt: skip
    inline = statistics.median(r[0] for r in results[0])
    print(f"\n{args.pages} site pages, {TASKS} tasks, {args.rounds} rounds (medians)")
    for size, rounds in results.items():
        rate = statistics.median(r[0] for r in rounds)
        cpu = statistics.median(r[1] for r in rounds)
        name = "inline (trio thread)" if size == 0 else f"{size} worker{'s' if size > 1 else ''}"
        print(f"  {name:21}: {rate:7.0f} documents/s  {rate / inline:5.2f}x inline   "
              f"trio thread {cpu:.3f} ms/document")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
