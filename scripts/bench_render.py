"""Rendering throughput and memory: crawld's browser engine next to two floors from a minimal
DevTools client of its own (scripts/render_baseline.py: its own process, the standard library
only, nothing from crawld) rendering the same script-built pages with the same Chromium and the
same number of tabs: `fresh`, a new browser context per page (isolation paid in full), and
`reuse`, the same tabs navigated from page to page (no isolation: the fastest this browser goes),
each tab shown in a window of its own as crawld's are (the floor checks every page it read was
visible). Also `reuse-background`, the reuse floor as it was before: its tabs in one window, of
which Chromium shows only the active one, so the others render hidden (no painting, no
animation frames), cheaper than a page a scrape renders. Not a test.

Each round: a fresh `crawld run` with [crawl.browser] (tabs = N, and pages_per_context as
configured, 50 by default) batch-scrapes the site's /js/bench/{i} pages (render "auto": each page
is fetched over HTTP, found script-built and rendered; or "always"), timed from the POST to
`completed`, the POST sent once crawld's browser has opened its tabs and stopped opening more for
2 s (the floor's clock also starts after its tabs are open); peak memory is the PSS sum of crawld
and every process of its browser. The same with pages_per_context = 1 (a new context per page,
as before issue 36). Then the floors render the same URLs. Rounds are interleaved; medians over
rounds and ratios are printed.

Also printed: the CPU time a page of the client (crawld's own process, or the floor's) and of
its browser (every process of it, those that exited included), while the clock ran: on a busy
machine pages/s follows the CPU a page.

    python scripts/bench_render.py [--pages 40] [--tabs 4] [--concurrency N] [--rounds 3]
                                   [--render auto] [--skip crawld1,fresh,reuse-background]
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
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from benchkit import free_port, wait_up  # noqa: E402  (scripts/: the benches' shared helpers)
from render_baseline import tree_cpu, tree_rss  # noqa: E402  (the baseline's process-tree readers)

Figures = tuple[float, float, float, float]
"""pages/s, peak MiB, CPU ms a page of the client (crawld or the floor's) and of its browser."""


def browser_path() -> str:
    from daemon.crawl.config import find_browser
    from daemon.crawl.rendering.browser import real_executable

    found = find_browser("")
    if found is None:
        sys.exit("no Chromium on PATH (apt-get install chromium)")
    return real_executable(found)


class Sampler:
    """Peak RSS of a process tree, sampled every 100 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.pid))
            time.sleep(0.1)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20


def crawld_round(
    urls: list[str],
    tabs: int,
    render: str,
    formats: list[str],
    pages_per_context: int,
    concurrency: int,
) -> Figures:
    with tempfile.TemporaryDirectory(prefix="bench-render-") as tmp:
        port = free_port()
        config = Path(tmp) / "crawld.toml"
        sandbox = "false" if os.geteuid() == 0 else "true"
        config.write_text(
            textwrap.dedent(f"""
            [daemon]
            state_dir = "state"
            log_level = "warning"
            [http]
            bind = "127.0.0.1:{port}"
            [collector]
            enabled = false
            [crawl]
            allow_cidrs = ["127.0.0.0/8"]
            concurrency = {max(tabs, 8)}
            per_host_concurrency = {max(tabs, 8)}
            render = "{render}"
            [crawl.browser]
            enabled = true
            tabs = {tabs}
            sandbox = {sandbox}
            restart_after = 100000
            pages_per_context = {pages_per_context}
            """)
        )
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "daemon", "run", "--config", str(config)], cwd=ROOT, env=env
        )
        try:
            return _batch(f"http://127.0.0.1:{port}", proc.pid, urls, formats, tabs, concurrency)
        finally:
            proc.terminate()
            proc.wait(30)


def _find(tree: object, key: str) -> object:
    """The first value of `key` anywhere in a JSON tree (None if none)."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        tree = list(tree.values())
    if isinstance(tree, list):
        for item in tree:
            if (found := _find(item, key)) is not None:
                return found
    return None


def wait_tabs(base: str, tabs: int, timeout: float = 60, still: float = 2.0) -> None:
    """Until crawld's browser has opened at least `tabs` tabs (it opens them when it starts) and
    opened no more for `still` seconds: its start-up is over, as the floor's is when its clock
    starts (it opens its tabs before)."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        status = httpx.get(base + "/status", timeout=5, trust_env=False).json()
        idle = int(_find(status, "tabs_idle") or 0)  # type: ignore[call-overload]
        if idle != last:
            last, since = idle, time.monotonic()
        elif idle >= tabs and time.monotonic() - since >= still:
            return
        time.sleep(0.1)
    raise TimeoutError("crawld's browser did not open its tabs")


def _batch(
    base: str, pid: int, urls: list[str], formats: list[str], tabs: int, concurrency: int
) -> Figures:
    wait_up(base + "/healthz")
    wait_tabs(base, tabs)
    sampler = Sampler(pid)
    with httpx.Client(base_url=base, trust_env=False, timeout=120) as client:
        own0, browser0 = tree_cpu(pid)
        t0 = time.perf_counter()
        body = {"urls": urls, "formats": formats, "maxConcurrency": concurrency}
        job = client.post("/v2/batch/scrape", json=body).json()["id"]
        while (status := client.get(f"/v2/batch/scrape/{job}", params={"limit": 1}).json())[
            "status"
        ] == "scraping":
            time.sleep(0.05)
        seconds = time.perf_counter() - t0
        own1, browser1 = tree_cpu(pid)
        peak = sampler.stop()
        if status["completed"] != len(urls):
            errors = client.get(f"/v2/batch/scrape/{job}/errors").json()["errors"][:3]
            sys.exit(f"crawld rendered {status['completed']} of {len(urls)}: {errors}")
        sample = client.get(f"/v2/batch/scrape/{job}", params={"limit": 1}).json()["data"][0]
        assert sample["metadata"]["engine"] == "browser", sample["metadata"]
    per_page = 1000 / len(urls)
    return len(urls) / seconds, peak, (own1 - own0) * per_page, (browser1 - browser0) * per_page


def baseline_round(mode: str, executable: str, urls: list[str], tabs: int) -> Figures:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render_baseline.py"), mode, executable,
         str(tabs), *urls],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if mode != "reuse-background" and result["visible"] != result["pages"]:
        sys.exit(f"the {mode} floor rendered {result['pages'] - result['visible']} pages hidden")
    per_page = 1000 / result["pages"]
    return (
        result["pages"] / result["seconds"], result["peak_mib"],
        result["client_cpu"] * per_page, result["browser_cpu"] * per_page,
    )  # fmt: skip


ROWS = (
    ("crawld", "crawld (reused tabs)"),
    ("crawld1", "crawld (context per page)"),
    ("fresh", "floor: fresh context"),
    ("reuse", "floor: reused tabs"),
    ("reuse-background", "floor: reused, 1 window"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tabs", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=0,
                        help="the batch's maxConcurrency (default: --tabs)")  # fmt: skip
    parser.add_argument("--render", choices=["auto", "always"], default="auto")
    parser.add_argument("--pages-per-context", type=int, default=50)
    parser.add_argument("--skip", default="", help="rows left out, comma-separated: crawld1,fresh")
    args = parser.parse_args()
    concurrency = args.concurrency or args.tabs
    skip = set(filter(None, args.skip.split(",")))
    executable = browser_path()
    site_port = free_port()
    site = subprocess.Popen(
        [sys.executable, "-m", "daemon.fakes.site", "--bind", f"127.0.0.1:{site_port}",
         "--processes", "2"],
        cwd=ROOT, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_up(f"http://127.0.0.1:{site_port}/robots.txt")
        urls = [f"http://127.0.0.1:{site_port}/js/bench/{i}" for i in range(args.pages)]
        print(f"{args.pages} script-built pages, {args.tabs} tabs, maxConcurrency {concurrency}, "
              f"render {args.render!r}, {executable}, {args.rounds} interleaved rounds (medians), "
              f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        rows: dict[str, list[Figures]] = {name: [] for name, _ in ROWS if name not in skip}
        ppc = args.pages_per_context
        runs = {
            "crawld": lambda: crawld_round(
                urls, args.tabs, args.render, ["markdown"], ppc, concurrency),
            "crawld1": lambda: crawld_round(
                urls, args.tabs, args.render, ["markdown"], 1, concurrency),
            "fresh": lambda: baseline_round("fresh", executable, urls, args.tabs),
            "reuse": lambda: baseline_round("reuse", executable, urls, args.tabs),
            "reuse-background": lambda: baseline_round(
                "reuse-background", executable, urls, args.tabs),
        }  # fmt: skip
        for n in range(args.rounds):  # interleaved, so load on the machine hits all alike
            for name in rows:
                rows[name].append(runs[name]())
            print(f"round {n + 1} (load {os.getloadavg()[0]:.1f}): "
                  + ", ".join(f"{k} {v[-1][0]:.1f}/s" for k, v in rows.items()))  # fmt: skip
        med = {k: tuple(statistics.median(f[i] for f in v) for i in range(4))
               for k, v in rows.items()}  # fmt: skip
        print("\n                             pages/s   peak MiB   vs fresh   vs reuse"
              "   CPU ms a page: own  browser")  # fmt: skip
        for name, label in ROWS:
            if name not in med:
                continue
            rate, mem, own, browser = med[name]
            fresh = f"{rate / med['fresh'][0]:6.2f}x" if "fresh" in med else "      -"
            reuse = f"{rate / med['reuse'][0]:6.2f}x" if "reuse" in med else "      -"
            print(f"  {label:<26} {rate:7.1f}   {mem:8.0f}    {fresh}    {reuse}"
                  f"              {own:4.0f}     {browser:4.0f}")  # fmt: skip
    finally:
        site.terminate()
        site.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
