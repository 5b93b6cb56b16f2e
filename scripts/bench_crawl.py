"""Crawl throughput and memory: crawld next to Scrapy on the same local site, same concurrency.

The generated site (`python -m daemon.fakes.site --pages N`) runs in its own process. Each round
runs, one after the other (interleaved, so machine load hits both alike):

- crawld: a fresh `crawld run` process; POST /v2/crawl of the site's page tree (robots.txt
  honoured, links followed, every page turned into a markdown document stored in SQLite and
  counted, and written to the document cache), timed from the POST to status `completed`; peak
  RSS (VmHWM) of the daemon plus that of its content workers, their forkserver and
  multiprocessing's resource tracker (`--workers` sets `[crawl] content_workers`: a
  comma-separated list runs one crawld per value in each round, for the scaling figure; their
  memory shared copy-on-write is counted once per process, so the sum overstates it: PSS, which
  shares it out, is printed too). And the CPU time per page of the first crawl, on the trio
  thread and over the daemon and its workers: on a busy machine throughput follows the share
  of the cores each side gets, CPU time per page much less so. Then the same crawl again on the
  same process: every page served from the document cache (links followed from the copies), its
  pages/s against the first pass.
- Scrapy: a minimal spider in its own process that imports nothing from `daemon`: robots.txt
  honoured, the same concurrency, and per page only the extraction of `<a href>` links (no
  markdown, no storage) - the fastest reasonable baseline for "crawl the site"; its CPU time
  per page too.

Then the frontier figure: crawld's RSS once 100,000 URLs are queued, found on 100 hub pages of
1,000 links each, and on one page linking all 100,000 (the worst case: one huge page in memory).

Scrapy is not a dependency of crawld: install it in a separate virtualenv and pass its python,
e.g. `python3.11 -m venv ~/scrapy-venv && ~/scrapy-venv/bin/pip install scrapy==2.19.0`.

Usage: .venv/bin/python scripts/bench_crawl.py
       --scrapy-python ~/scrapy-venv/bin/python [--pages 5000] [--concurrency 16] [--rounds 3]
       [--frontier 100000] [--workers auto|N[,N...]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
from benchkit import free_port, wait_up

ROOT = Path(__file__).resolve().parents[1]

SPIDER = textwrap.dedent(
    """
    import json, resource, sys, time
    import scrapy
    from scrapy.crawler import CrawlerProcess

    start, concurrency = sys.argv[1], int(sys.argv[2])
    stats = {"pages": 0}

    class TreeSpider(scrapy.Spider):
        name = "tree"

        async def start(self):
            stats["t0"], stats["c0"] = time.perf_counter(), time.process_time()
            yield scrapy.Request(start)

        def parse(self, response):
            stats["pages"] += 1
            for href in response.css("a::attr(href)").getall():
                url = response.urljoin(href)
                if "/pages/" in url:
                    yield scrapy.Request(url)

        def closed(self, reason):
            stats["t1"], stats["c1"] = time.perf_counter(), time.process_time()

    process = CrawlerProcess(settings={
        "CONCURRENT_REQUESTS": concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": concurrency,
        "ROBOTSTXT_OBEY": True,
        "LOG_LEVEL": "ERROR",
        "TELNETCONSOLE_ENABLED": False,
        "USER_AGENT": "scrapy-bench FirecrawlAgent",
    })
    process.crawl(TreeSpider)
    process.start()
    maxrss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"pages": stats["pages"], "seconds": stats["t1"] - stats["t0"],
                      "cpu": stats["c1"] - stats["c0"],
                      "rss_mib": maxrss_kib / 1024}))
    """
)

HUB = textwrap.dedent(
    """
    import http.server, sys
    count, per_page = int(sys.argv[2]), int(sys.argv[3])
    def links(urls):
        return ("<html><body>" + "".join(f'<a href="{u}">{u}</a>' for u in urls)
                + "</body></html>").encode()
    hubs = range((count + per_page - 1) // per_page)
    top = links(f"/hub/{k}" for k in hubs)
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/hub":
                body = top
            elif self.path.startswith("/hub/"):
                k = int(self.path[5:])
                body = links(f"/p/{i}" for i in range(k * per_page, min(count, (k + 1) * per_page)))
            else:
                body = b"<html><body>page</body></html>"
            if self.path == "/robots.txt":
                self.send_response(404); self.end_headers(); return
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)


# `--browser`: crawld with its headless Chromium and render = "auto", to show that pages which
# need no browser (the site's pages have no scripts) cost the same with a browser configured.
BROWSER_SECTION = f"""
[crawl.browser]
enabled = true
sandbox = {"false" if os.geteuid() == 0 else "true"}
"""


def proc_status(pid: int, field: str) -> float:
    """A /proc/PID/status memory field (VmRSS, VmHWM) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise LookupError(field)


def family(pid: int) -> list[int]:
    """`pid` and every process descended from it (the content workers are the forkserver's)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [pid], [pid]
    while todo:
        parent = todo.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        todo += children
    return found


def family_memory(pid: int) -> tuple[float, float]:
    """(sum of peak RSS, sum of PSS now) in MiB over `pid` and its descendants."""
    hwm = pss = 0.0
    for p in family(pid):
        try:
            hwm += proc_status(p, "VmHWM")
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text().splitlines()
        except (OSError, LookupError):
            continue
        pss += sum(int(x.split()[1]) for x in rollup if x.startswith("Pss:")) / 1024
    return hwm, pss


class Crawld:
    """A crawld process with a fresh state directory."""

    def __init__(self, concurrency: int, browser: bool = False, workers: str = "auto") -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-crawl-")
        self.port = free_port()
        config = Path(self.tmp.name) / "crawld.toml"
        config.write_text(
            textwrap.dedent(f"""
            [daemon]
            state_dir = "state"
            log_level = "warning"
            [http]
            bind = "127.0.0.1:{self.port}"
            [collector]
            enabled = false
            [crawl]
            allow_cidrs = ["127.0.0.0/8"]
            concurrency = {concurrency}
            per_host_concurrency = {concurrency}
            content_workers = {json.dumps(workers) if workers == "auto" else int(workers)}
            """)
            + (BROWSER_SECTION if browser else "[crawl.browser]\nenabled = false\n")
        )
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daemon", "run", "--config", str(config)], cwd=ROOT, env=env
        )
        self.base = f"http://127.0.0.1:{self.port}"
        wait_up(self.base + "/healthz")
        self.client = httpx.Client(base_url=self.base, trust_env=False, timeout=60)

    def start(self, body: dict) -> str:
        answer = self.client.post("/v2/crawl", json=body)
        answer.raise_for_status()
        return str(answer.json()["id"])

    def status(self, job_id: str) -> dict:
        return self.client.get(f"/v2/crawl/{job_id}", params={"limit": 1}).json()

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(30)
        self.tmp.cleanup()


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """CPU time (user + system) of a process, or of one of its threads."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid is not None else f"/proc/{pid}/stat"
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def crawl_cpu(pid: int) -> tuple[float, float]:
    """(CPU seconds of the daemon's main thread, the trio thread; of it and its workers)."""
    return cpu_seconds(pid, pid), sum(cpu_seconds(p) for p in family(pid))


def crawl_pass(
    daemon: Crawld, site: str, concurrency: int, pages: int
) -> tuple[float, int, float, float]:
    """(pages/s, pages, trio thread CPU ms/page, CPU ms/page of the daemon and its workers) of
    one crawl of the page tree, from the POST to `completed`."""
    loop0, all0 = crawl_cpu(daemon.proc.pid)
    t0 = time.perf_counter()
    job = daemon.start({"url": f"{site}/pages/0", "sitemap": "skip", "limit": pages,
                        "crawlEntireDomain": True, "includePaths": ["^/pages/"],
                        "maxConcurrency": concurrency})  # fmt: skip
    while (status := daemon.status(job))["status"] == "scraping":
        time.sleep(0.05)
    seconds = time.perf_counter() - t0
    loop1, all1 = crawl_cpu(daemon.proc.pid)
    done = max(status["completed"], 1)
    per_page = 1000 / done
    return done / seconds, done, (loop1 - loop0) * per_page, (all1 - all0) * per_page


Round = tuple[float, float, int, float, int, float, float, float]


def crawld_round(
    site: str, concurrency: int, pages: int, browser: bool = False, workers: str = "auto"
) -> Round:
    """(pages/s, peak RSS MiB, pages) of a first crawl (every page fetched, and written to the
    document cache), then (pages/s, pages) of the same crawl again on the same daemon: every
    page from the cache (Firecrawl's default maxAge, 2 days), links followed from the copies;
    then the PSS (MiB) of the daemon and its workers after the first crawl, and the first
    crawl's CPU ms per page on the trio thread and over the daemon and its workers."""
    daemon = Crawld(concurrency, browser, workers)
    try:
        rate, done, loop_ms, all_ms = crawl_pass(daemon, site, concurrency, pages)
        rss, pss = family_memory(daemon.proc.pid)
        cached_rate, cached_done, _, _ = crawl_pass(daemon, site, concurrency, pages)
    finally:
        daemon.close()
    return rate, rss, done, cached_rate, cached_done, pss, loop_ms, all_ms


def scrapy_round(
    python: str, spider: Path, site: str, concurrency: int
) -> tuple[float, float, int, float]:
    out = subprocess.run(
        [python, str(spider), f"{site}/pages/0", str(concurrency)],
        capture_output=True, text=True, check=True, cwd=spider.parent,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    cpu_ms = result["cpu"] * 1000 / max(result["pages"], 1)
    return result["pages"] / result["seconds"], result["rss_mib"], result["pages"], cpu_ms


def frontier_rss(count: int, per_page: int) -> tuple[float, float, int]:
    """crawld's RSS once `count` URLs are queued, found on hub pages of `per_page` links each
    (the hub pages come first in the frontier, so their links are all queued before the first
    of them is fetched)."""
    port = free_port()
    hub = subprocess.Popen([sys.executable, "-c", HUB, str(port), str(count), str(per_page)])
    daemon = Crawld(4)
    hubs = (count + per_page - 1) // per_page
    try:
        wait_up(f"http://127.0.0.1:{port}/robots.txt")
        idle = proc_status(daemon.proc.pid, "VmRSS")
        job = daemon.start({"url": f"http://127.0.0.1:{port}/hub", "sitemap": "skip",
                            "limit": count + hubs + 1, "crawlEntireDomain": True,
                            "maxConcurrency": 1})  # fmt: skip
        deadline = time.monotonic() + 300
        while (status := daemon.status(job))["total"] < count + hubs + 1:
            if time.monotonic() > deadline:
                raise TimeoutError(f"frontier reached only {status['total']} URLs")
            time.sleep(0.1)
        rss = proc_status(daemon.proc.pid, "VmRSS")
        daemon.client.delete(f"/v2/crawl/{job}")
    finally:
        daemon.close()
        hub.terminate()
        hub.wait(10)
    return idle, rss, status["total"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapy-python", required=True, help="python of a venv with scrapy")
    parser.add_argument("--pages", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="0: only the frontier figure")
    parser.add_argument("--frontier", type=int, default=100_000)
    parser.add_argument(
        "--browser", action="store_true", help="crawld with [crawl.browser] and render = auto"
    )
    parser.add_argument(
        "--workers", default="auto", help="[crawl] content_workers, or a comma-separated list"
    )
    args = parser.parse_args()
    settings = args.workers.split(",")

    site_port = free_port()
    site = f"http://127.0.0.1:{site_port}"
    site_proc = subprocess.Popen(
        [sys.executable, "-m", "daemon.fakes.site", "--bind", f"127.0.0.1:{site_port}",
         "--pages", str(args.pages)],
        cwd=ROOT, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    ours: dict[str, list[Round]] = {w: [] for w in settings}
    theirs: list[tuple[float, float, int, float]] = []
    try:
        wait_up(site + "/robots.txt")
        with tempfile.TemporaryDirectory(prefix="bench-scrapy-") as tmp:
            spider = Path(tmp) / "spider.py"
            spider.write_text(SPIDER)
            for r in range(args.rounds):
                # Each round turns the order of the settings, so none always runs first.
                for w in settings[r % len(settings) :] + settings[: r % len(settings)]:
                    ours[w].append(
                        crawld_round(site, args.concurrency, args.pages, args.browser, w)
                    )
                    last = ours[w][-1]
                    print(f"round {r + 1}: crawld, content_workers={w}: {last[0]:.0f} pages/s "
                          f"({last[2]} pages), from the cache {last[3]:.0f} pages/s "
                          f"({last[4]} pages); CPU ms/page: trio thread {last[6]:.2f}, "
                          f"all {last[7]:.2f}", flush=True)  # fmt: skip
                theirs.append(scrapy_round(args.scrapy_python, spider, site, args.concurrency))
                print(f"round {r + 1}: scrapy {theirs[-1][0]:.0f} pages/s "
                      f"({theirs[-1][2]} pages), CPU {theirs[-1][3]:.2f} ms/page",
                      flush=True)  # fmt: skip
    finally:
        site_proc.terminate()
        site_proc.wait(10)

    if theirs:
        report(args, ours, theirs)
    if args.frontier:
        print()
        for per_page in (1000, args.frontier):
            idle, rss, total = frontier_rss(args.frontier, per_page)
            print(
                f"frontier of {total} URLs, {per_page} links per page: crawld RSS {rss:.0f} MiB "
                f"(idle {idle:.0f} MiB, +{rss - idle:.0f} MiB)"
            )
    return 0


def report(
    args: argparse.Namespace,
    ours: dict[str, list[Round]],
    theirs: list[tuple[float, float, int, float]],
) -> None:
    base = statistics.median(r[0] for r in theirs)
    print(
        f"\n{args.pages}-page site, concurrency {args.concurrency}, {args.rounds} rounds (medians)"
    )
    print(
        f"  scrapy (links only)               : {base:8.0f} pages/s   "
        f"peak RSS {statistics.median(r[1] for r in theirs):6.0f} MiB   "
        f"CPU {statistics.median(r[3] for r in theirs):.2f} ms/page"
    )
    for workers, rounds in ours.items():
        rate = statistics.median(r[0] for r in rounds)
        cached = statistics.median(r[3] for r in rounds)
        rss = statistics.median(r[1] for r in rounds)
        pss = statistics.median(r[5] for r in rounds)
        print(f"  crawld, content_workers = {workers}")
        print(
            f"    markdown documents stored       : {rate:8.0f} pages/s   "
            f"peak RSS {rss:6.0f} MiB (PSS after the crawl {pss:.0f} MiB)"
        )
        loop = statistics.median(r[6] for r in rounds)
        every = statistics.median(r[7] for r in rounds)
        print(f"    CPU per page                    : {loop:8.2f} ms on the trio thread, "
              f"{every:.2f} ms with the other threads and the workers")  # fmt: skip
        print(f"    again, from the cache           : {cached:8.0f} pages/s")
        per_round = statistics.median(o[0] / t[0] for o, t in zip(rounds, theirs, strict=True))
        print(f"    ratio crawld / scrapy           : {rate / base:8.2f}x   "
              f"(median of the rounds' ratios {per_round:.2f}x)")  # fmt: skip
        print(f"    ratio cached pass / first pass  : {cached / rate:8.2f}x")


if __name__ == "__main__":
    sys.exit(main())
