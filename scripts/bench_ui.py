"""Time to a drawn view curve in the console, in headless Chromium, for a video with 1k, 100k
(and 1M) snapshots, and the server time of the curve request next to the same query run
directly.

For each size: crawld runs in this process (SQLite store in a temporary directory) with one
tracked video holding N snapshots spread over 60 days; Debian's Chromium (driven over the
DevTools pipe, tests/ui/cdp.py) opens the video page: "page to chart" runs from Page.navigate
to the moment the curve's <svg> is in the page (default range 7d), "chart (all)" from the click
on the "all" range to its redrawn <svg> (all N snapshots read and decimated to at most 1000
points, plus the ~50-row table). Goal: <= 1 s at 100k. "overview" runs from Page.navigate to
the overview's queue chart (the last hour kept by the server, /status next to it).

Next to it, the curve request alone (`GET /ui/api/videos/{aid}/curve?range=all`, median of
--rounds) and the baseline: the same SELECT run by plain APSW against the same file in a process
of its own that imports nothing from `daemon` (checked), plus the same min/max bucketing written
inline there, so the difference is what crawld adds (the store's reader pool, JSON, HTTP).

Usage: .venv/bin/python scripts/bench_ui.py [--sizes 1000,100000,1000000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BASELINE = r"""
import json, sys, time
import apsw
assert not any(m == "daemon" or m.startswith("daemon.") for m in sys.modules)
path, aid, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
times = []
for _ in range(rounds):
    start = time.perf_counter()
    rows = conn.execute(
        "SELECT at_ms, views, danmakus, replies, likes, coins, shares, favorites"
        " FROM tracker_snapshots WHERE aid = ? AND at_ms BETWEEN ? AND ? ORDER BY at_ms LIMIT ?",
        (aid, 0, 2**53, 2**62)).fetchall()
    kept = rows
    if len(rows) > 1000:
        buckets, first = 500, rows[0][0]
        width = (rows[-1][0] - first) / buckets or 1.0
        groups = {}
        for r in rows:
            b = min(buckets - 1, int((r[0] - first) / width))
            lo, hi = groups.get(b, (r, r))
            groups[b] = (r if r[1] < lo[1] else lo, r if r[1] > hi[1] else hi)
        kept = sorted({x for pair in groups.values() for x in pair})
    json.dumps([[r[0], r[1], r[4], r[5]] for r in kept])
    times.append(time.perf_counter() - start)
assert not any(m == "daemon" or m.startswith("daemon.") for m in sys.modules)
print(json.dumps({"rows": len(rows), "times": times}))
"""


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


async def bench_size(size: int, rounds: int, browser: object) -> dict[str, object]:
    import functools

    import httpx
    import trio

    from daemon import settings as config
    from daemon.app import run_daemon
    from daemon.systemd import Notifier
    from tests.ui.cdp import Browser
    from tests.ui.conftest import DAY_MS, add_video

    assert isinstance(browser, Browser)
    with tempfile.TemporaryDirectory(prefix="crawld-bench-ui-") as tmp:
        path = Path(tmp) / "crawld.toml"
        path.write_text(
            f'[daemon]\nstate_dir = "{tmp}"\n[http]\nbind = "127.0.0.1:0"\n'
            "[crawl.browser]\nenabled = false\n"
        )
        async with trio.open_nursery() as nursery:
            cfg = config.load(path)
            daemon = await nursery.start(
                functools.partial(run_daemon, cfg, notifier=Notifier(None))
            )
            started = time.perf_counter()
            await add_video(daemon, 1, title="bench", snapshots=size, span_ms=60 * DAY_MS)
            seeded = time.perf_counter() - started
            host, port = daemon.http_address
            base = f"http://{host}:{port}"
            server: list[float] = []
            async with httpx.AsyncClient(base_url=base, trust_env=False) as http:
                for _ in range(rounds + 1):
                    t0 = time.perf_counter()
                    answer = await http.get("/ui/api/videos/1/curve", params={"range": "all"})
                    server.append(time.perf_counter() - t0)
                    assert answer.status_code == 200, answer.text
                points = answer.json()["count"]
            server = server[1:]  # the first warms the page cache

            def drawn() -> tuple[list[float], list[float], list[float]]:
                loads, switches, overviews = [], [], []
                for _ in range(rounds):
                    page = browser.new_page()
                    t0 = time.perf_counter()
                    page.goto(f"{base}/ui#/video/1")
                    page.wait("document.querySelector('svg.chart[data-points]')", timeout=60)
                    loads.append(time.perf_counter() - t0)
                    page.js("document.querySelector('[data-range=all]').click()")
                    t1 = time.perf_counter()
                    page.wait("document.querySelector('svg.chart').getAttribute('aria-label')"
                              ".includes('over all')", timeout=60)  # fmt: skip
                    switches.append(time.perf_counter() - t1)
                    t2 = time.perf_counter()
                    page.goto(f"{base}/ui#/overview")
                    page.wait("document.querySelector('svg.queue-chart')", timeout=60)
                    overviews.append(time.perf_counter() - t2)
                    target = page.call("Target.getTargetInfo")["targetInfo"]["targetId"]
                    browser.send("Target.closeTarget", {"targetId": target})
                return loads, switches, overviews

            loads, chart, overview = await trio.to_thread.run_sync(drawn)
            db = Path(tmp) / "crawld.db"
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            out = await trio.run_process(
                [sys.executable, "-c", BASELINE, str(db), "1", str(rounds)],
                capture_stdout=True, env=env, cwd=tempfile.gettempdir(),
            )  # fmt: skip
            baseline = json.loads(out.stdout)
            daemon.request_stop()
        return {
            "snapshots": size,
            "seed_s": round(seeded, 2),
            "points_drawn": points,
            "page_load_7d_ms": median_ms(loads),
            "chart_ms": median_ms(chart),
            "curve_request_ms": median_ms(server),
            "baseline_query_ms": median_ms(baseline["times"]),
            "overview_ms": median_ms(overview),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,100000,1000000")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import trio

    from tests.ui.cdp import browser

    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    with browser() as opened:

        async def all_sizes() -> None:
            for size in sizes:
                result = await bench_size(size, args.rounds, opened)
                results.append(result)
                print(json.dumps(result), flush=True)

        trio.run(all_sizes)
    print(f"{'snapshots':>10} {'points':>7} {'page to chart (7d)':>19} {'chart (all)':>12} "
          f"{'curve request':>14} {'same query, plain APSW':>23} {'overview':>9}")  # fmt: skip
    for r in results:
        print(f"{r['snapshots']:>10,} {r['points_drawn']:>7} {r['page_load_7d_ms']:>16} ms "
              f"{r['chart_ms']:>9} ms {r['curve_request_ms']:>11} ms "
              f"{r['baseline_query_ms']:>20} ms {r['overview_ms']:>6} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
