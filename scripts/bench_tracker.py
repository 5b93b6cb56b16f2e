"""The tracker's service levels (specs/tracker.md, "Service levels to measure"), each next to a
baseline measured in the same run.

- Due query: the 1 s tick's select of due schedules (`store.due`, single types) at 10k, 1M and
  10M schedule rows, with its query plan; baseline: the same SQL from plain APSW in its own
  process. Also the bulk tick's select (normal, archive; up to 1000).
- Loop block: the longest trio task step while the 1 s tick claims due schedules on the 10M-row
  database (its SQL runs in the store's threads); baseline: the same select run inline on the
  trio loop, in its own process.
- Bulk path throughput: snapshots stored per second by claim → bulk request → complete (the
  engine's steps, httpx, the delegate, the simulator in its own process answering at once, limits
  raised so the path and not the upstream budget is measured); baseline: a plain APSW loop in its
  own process writing the same rows (claim, snapshot, completion, next schedule, eta) with the
  same grouping (1000 per claim, 30 per transaction), one statement per row. A second baseline
  also makes crawld's per-row reads (the regular interval's base snapshots, the active normal
  schedule, the full windows) before placing the next schedule. Interleaved rounds, medians.
- Snapshots per upstream request on the bulk path (the ideal is the group size, 30).
- Lag p50/p99 of milestone, new and normal schedules with a busy upstream (the simulator
  answering in 50-200 ms, enforcing Bilibili's limits and counting -412s, which must be 0), the
  1 s and 15 s ticks running on the wall clock with `--songs` tracked songs; baseline: the same
  ticks with an idle upstream (no latency, no bulk load).

Usage: .venv/bin/python scripts/bench_tracker.py [--rows 10000,1000000,10000000] [--songs N]
       [--bulk-songs N] [--rounds N] [--lag-seconds S] [--idle-seconds S] [--keep DIR]
       [--only due|bulk|lag ...]   (e.g. `--only bulk` for the throughput figure alone)
Run it when nothing else heavy runs: it loads the machine for a few minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import httpx
import trio

from daemon.clock import sleep_until_ms, wall_ms
from daemon.store import migrate, one, open_store
from daemon.tracker import rules
from daemon.tracker import store as ts
from daemon.tracker.bilibili import BiliClient
from daemon.tracker.classifier import RuleClassifier
from daemon.tracker.config import Limit, ProxyConfig, TrackerConfig
from daemon.tracker.delegate import NetworkDelegate
from daemon.tracker.engine import BULK_CONCURRENCY, Tracker

HOUR = 3_600_000
DAY = 24 * HOUR
SINGLE_TYPES = [t for group in rules.SINGLE_TYPES_BY_PRIORITY for t in group]
BULK_TYPES = [t for group in rules.BULK_TYPES_BY_PRIORITY for t in group]
SINGLE_LIMIT = rules.SINGLE_LIMIT * 5  # what the tick asks the store for
DUE_SQL = ts.DUE_SQL  # the baseline runs the store's own select

# The baselines: plain APSW (and trio for the inline one), in their own process, importing
# nothing from `daemon`.
BASELINE = r"""
import json, statistics, sys, time
import apsw

mode, args = sys.argv[1], json.loads(sys.argv[2])
DUE = args["due_sql"]


def due(conn, types, low, high, limit):
    found = []
    for t in types:
        if len(found) >= limit:
            break
        found.extend(conn.execute(DUE, (t, low, high, limit - len(found))).fetchall())
    return found


if mode == "due":
    conn = apsw.Connection(args["db"], flags=apsw.SQLITE_OPEN_READONLY)
    times = []
    for _ in range(args["calls"]):
        t0 = time.perf_counter()
        rows = due(conn, args["types"], args["low"], args["high"], args["limit"])
        times.append(time.perf_counter() - t0)
    times.sort()
    print(json.dumps({"median_us": statistics.median(times) * 1e6,
                      "p99_us": times[int(len(times) * 0.99)] * 1e6, "rows": len(rows)}))

elif mode == "inline":
    import trio

    steps = []

    class Steps(trio.abc.Instrument):
        def before_task_step(self, task):
            self.t0 = time.perf_counter()

        def after_task_step(self, task):
            steps.append(time.perf_counter() - self.t0)

    async def main():
        conn = apsw.Connection(args["db"], flags=apsw.SQLITE_OPEN_READONLY)
        for _ in range(args["calls"]):
            due(conn, args["types"], args["low"], args["high"], args["limit"])
            await trio.sleep(0)

    trio.run(main, instruments=[Steps()])
    steps.sort()
    print(json.dumps({"max_ms": steps[-1] * 1e3, "p99_ms": steps[int(len(steps) * 0.99)] * 1e3}))

elif mode == "insert":
    conn = apsw.Connection(args["db"])
    conn.execute("pragma journal_mode=wal")
    conn.execute("pragma synchronous=normal")
    conn.execute("pragma foreign_keys=on")
    now, group = args["now"], args["group"]
    stored = 0
    t0 = time.perf_counter()
    while True:
        with conn:
            rows = due(conn, ["normal", "archive"], now - 120_000, now + 15_000, 1000)
            for sid, *_ in rows:
                conn.execute("UPDATE tracker_schedules SET status = 'processing', started_ms = ?"
                             " WHERE id = ? AND status = 'pending'", (now, sid))
        if not rows:
            break
        for i in range(0, len(rows), group):
            with conn:
                for sid, aid, type_, planned in rows[i:i + group]:
                    latest = conn.execute("SELECT at_ms, views FROM tracker_latest WHERE aid = ?",
                                          (aid,)).fetchone()
                    views = latest[1] + 100
                    conn.execute(
                        "INSERT OR IGNORE INTO tracker_snapshots(aid, at_ms, views, danmakus,"
                        " replies, likes, coins, shares, favorites) VALUES (?,?,?,?,?,?,?,?,?)",
                        (aid, now + 1, views, 1, 2, 3, 4, 5, 6))
                    conn.execute(
                        "INSERT INTO tracker_eta(aid, eta_hours, speed, views, updated_ms)"
                        " VALUES (?, ?, ?, ?, ?) ON CONFLICT(aid) DO UPDATE SET"
                        " eta_hours = excluded.eta_hours, speed = excluded.speed,"
                        " views = excluded.views, updated_ms = excluded.updated_ms",
                        (aid, 100.0, 4.0, views, now))
                    conn.execute("UPDATE tracker_schedules SET status = 'completed',"
                                 " finished_ms = ? WHERE id = ? AND status = 'processing'",
                                 (now, sid))
                    planned = now + 12 * 3_600_000
                    if args["same"]:
                        # what crawld also reads per row: the regular interval's base snapshots,
                        # an active normal schedule, the full windows from the target on
                        cut = now - 24 * 3_600_000
                        conn.execute("SELECT at_ms, views FROM tracker_snapshots WHERE aid = ?"
                                     " AND at_ms <= ? ORDER BY at_ms DESC LIMIT 1",
                                     (aid, cut)).fetchone()
                        conn.execute("SELECT at_ms, views FROM tracker_snapshots WHERE aid = ?"
                                     " AND at_ms > ? ORDER BY at_ms LIMIT 1", (aid, cut)).fetchone()
                        conn.execute("SELECT id FROM tracker_schedules WHERE aid = ?"
                                     " AND type = 'normal' AND status IN ('pending', 'processing')"
                                     " LIMIT 1", (aid,)).fetchone()
                        win = planned // 300_000
                        full = {r[0] for r in conn.execute(
                            "SELECT win FROM tracker_windows WHERE win BETWEEN ? AND ?"
                            " AND pending >= ?", (win, win + 4032, 3000))}
                        while win in full:
                            win += 1
                        planned = max(planned, win * 300_000)
                    conn.execute("INSERT INTO tracker_schedules(aid, type, planned_ms, created_ms)"
                                 " VALUES (?, 'normal', ?, ?)", (aid, planned, now))
                    stored += 1
    elapsed = time.perf_counter() - t0
    print(json.dumps({"snapshots": stored, "seconds": elapsed, "rate": stored / elapsed}))
"""


def baseline(mode: str, **args: Any) -> dict[str, Any]:
    args["due_sql"] = DUE_SQL
    done = subprocess.run(
        [sys.executable, "-c", BASELINE, mode, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        cwd=tempfile.gettempdir(),
    )
    if done.returncode != 0:
        raise SystemExit(f"baseline {mode} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def ratio(measured: float, base: float) -> str:
    return f"{measured / base:.2f}x" if base else "n/a"


class StepTimes(trio.abc.Instrument):
    """How long each trio task step ran: the time the loop was blocked by it."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self.on = False
        self._t0: float | None = None
        self.longest_task = ""

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._t0 = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        started, self._t0 = self._t0, None
        if self.on and started is not None:  # not the step that installed the instrument
            took = time.perf_counter() - started
            if not self.steps or took > max(self.steps):
                self.longest_task = task.name
            self.steps.append(took)

    def summary(self) -> tuple[float, float]:
        ordered = sorted(self.steps) or [0.0]
        return ordered[-1] * 1e3, ordered[int(len(ordered) * 0.99)] * 1e3


# ---- seeding (plain APSW, fast) ---------------------------------------------------------------


def new_db(path: Path) -> apsw.Connection:
    conn = apsw.Connection(str(path))
    conn.execute("pragma journal_mode=wal")
    conn.execute("pragma synchronous=off")
    migrate(conn)
    return conn


def bulk_load_schedules(conn: apsw.Connection, rows: Iterator[tuple[Any, ...]]) -> None:
    """Insert schedule rows with the indexes and triggers off, then rebuild them (and the counts
    the triggers keep) as the store would have them."""
    kept = conn.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE tbl_name = 'tracker_schedules'"
        " AND type IN ('index', 'trigger') AND sql IS NOT NULL"
    ).fetchall()
    with conn:
        for kind, name, _ in kept:
            conn.execute(f"DROP {kind.upper()} {name}")
        conn.executemany(
            "INSERT INTO tracker_schedules(aid, type, status, planned_ms, created_ms, started_ms,"
            " finished_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
    with conn:
        for _, _, sql in kept:
            conn.execute(sql)
        conn.execute("DELETE FROM tracker_schedule_counts")
        conn.execute(
            "INSERT INTO tracker_schedule_counts(type, status, n)"
            " SELECT type, status, count(*) FROM tracker_schedules GROUP BY type, status"
        )
        conn.execute("DELETE FROM tracker_windows")
        conn.execute(
            "INSERT INTO tracker_windows(win, pending) SELECT planned_ms / 300000, count(*)"
            " FROM tracker_schedules WHERE status = 'pending' GROUP BY 1"
        )
    conn.execute("ANALYZE")


def schedule_rows(count: int, now: int, seed: int = 1) -> Iterator[tuple[Any, ...]]:
    """`count` schedule rows like a long-running tracker's: 95% finished over the last 60 days,
    5% pending over the next 14 days (normal 60%, archive 25%, milestone 10%, new 5%), plus a
    busy instant at `now`: 50 single-type rows due in the 1 s tick's range and 1500 normal rows
    in the bulk tick's, so both selects return full answers."""
    rng = random.Random(seed)
    songs = max(count // 100, 1000)
    singles = ["milestone", "new", "archive"]
    for i in range(50):
        yield (2_000_000 + i, singles[i % 3], "pending", now - 59_000 + i * 1000, now - DAY,
               None, None)  # fmt: skip
    for i in range(1500):
        yield (3_000_000 + i, "normal", "pending", now - 119_000 + i * 80, now - DAY, None, None)
    types = ["normal"] * 12 + ["archive"] * 5 + ["milestone"] * 2 + ["new"]
    for _ in range(count - 1550):
        aid = 1_000_000 + rng.randrange(songs)
        type_ = types[rng.randrange(20)]
        if rng.random() < 0.05:
            planned = now - HOUR + rng.randrange(14 * DAY + HOUR)
            yield (aid, type_, "pending", planned, planned - DAY, None, None)
        else:
            planned = now - 60 * DAY + rng.randrange(60 * DAY - HOUR)
            yield (aid, type_, "completed", planned, planned - DAY, planned + 50, planned + 300)


def seed_songs(
    conn: apsw.Connection, aids: list[int], now: int, plan: Callable[[int, int], int | None]
) -> None:
    """Videos, songs, two snapshots each and a pending normal schedule at `plan(i, aid)`."""
    with conn:
        conn.execute(
            "INSERT INTO tracker_users(uid, name, sign, fans, face, updated_ms)"
            " VALUES (1, 'up', '', 10, '', ?)",
            (now,),
        )
        conn.executemany(
            "INSERT INTO tracker_videos(aid, bvid, title, description, tags, duration,"
            " published_ms, cover_url, uid, status, added_ms)"
            " VALUES (?, '', '【洛天依原创】歌', '', '[]', 200, ?, '', 1, 0, ?)",
            ((aid, now - 30 * DAY, now - 29 * DAY) for aid in aids),
        )
        conn.executemany(
            "INSERT INTO tracker_songs(aid, label, added_ms) VALUES (?, 1, ?)",
            ((aid, now - 29 * DAY) for aid in aids),
        )
        for at, views in ((now - 25 * HOUR, 1000), (now - HOUR, 1500)):
            conn.executemany(
                "INSERT INTO tracker_snapshots(aid, at_ms, views, danmakus, replies, likes,"
                " coins, shares, favorites) VALUES (?, ?, ?, 0, 0, 0, 0, 0, 0)",
                ((aid, at, views) for aid in aids),
            )
        conn.executemany(
            "INSERT INTO tracker_schedules(aid, type, planned_ms, created_ms)"
            " VALUES (?, 'normal', ?, ?)",
            (
                (aid, at, now - HOUR)
                for i, aid in enumerate(aids)
                if (at := plan(i, aid)) is not None
            ),
        )


# ---- the simulator in its own process ---------------------------------------------------------


@contextlib.contextmanager
def simulator(workdir: Path, videos: int, *extra: str) -> Iterator[tuple[str, list[int]]]:
    aids_file = workdir / f"sim-aids-{videos}.txt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon.fakes.bilibili", "--bind", "127.0.0.1:0",
         "--videos", str(videos), "--publish-every", "0", "--aids-out", str(aids_file), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if "http://" not in first:
            raise SystemExit(f"the simulator did not start: {first!r}")
        base = first.strip().split(" on ", 1)[1]
        aids = [int(x) for x in aids_file.read_text().split()]
        yield base, aids
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.asynccontextmanager
async def tracker_on(
    db: Path,
    base: str,
    proxies: list[ProxyConfig],
    *,
    clock: Callable[[], int] = wall_ms,
    fresh_upstream: bool = True,
) -> AsyncIterator[tuple[Tracker, NetworkDelegate]]:
    """The engine over `db` and the simulator at `base`. With `fresh_upstream` the simulator has
    seen no request from us (every burst is available); else the limiter state the previous run
    saved at its end is restored, as a daemon restart does."""
    config = TrackerConfig(enabled=True, base_url=base, proxies=proxies)
    async with open_store(db) as store, httpx.AsyncClient() as http:
        delegate = NetworkDelegate(config.effective_proxies(), clock=clock, http=http)
        if fresh_upstream:
            delegate.assume_idle()
        else:
            await delegate.load_state(store)
        tracker = Tracker(config, store, BiliClient(delegate, base), RuleClassifier(), clock=clock)
        try:
            yield tracker, delegate
        finally:
            await delegate.save_state(store, final=True)
            await delegate.aclose()


async def sim_stats(base: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"{base}/_sim/stats")
        result: dict[str, Any] = answer.json()
        return result


async def sim_latency(base: str, least: int, most: int) -> None:
    async with httpx.AsyncClient() as http:
        answer = await http.post(f"{base}/_sim/latency", json={"min_ms": least, "max_ms": most})
        answer.raise_for_status()


# ---- 1. due query and loop block --------------------------------------------------------------


def measure_due(conn: apsw.Connection, types: list[str], low: int, high: int, limit: int,
                calls: int) -> tuple[float, float, int]:  # fmt: skip
    times = []
    rows: list[Any] = []
    for _ in range(calls):
        t0 = time.perf_counter()
        rows = ts.due(conn, types, low, high, limit)
        times.append(time.perf_counter() - t0)
    times.sort()
    return statistics.median(times) * 1e6, times[int(len(times) * 0.99)] * 1e6, len(rows)


def query_plan(conn: apsw.Connection) -> list[str]:
    return [
        row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + DUE_SQL, ("milestone", 0, 1, 10))
    ]


async def claim_ticks(db: Path, now: int, ticks: int) -> tuple[float, float, int, str]:
    """Run the 1 s tick's claim `ticks` times on `db` (at instants a second apart); returns the
    longest and p99 trio step (ms) and the schedules claimed."""
    instants = iter(range(now, now + ticks * 1000 + 1, 1000))
    current = [now]

    def clock() -> int:
        return current[0]

    steps = StepTimes()
    trio.lowlevel.add_instrument(steps)
    claimed = 0
    gc.collect()
    gc.freeze()  # the bench's own seeding garbage is not the tick's
    async with tracker_on(db, "http://127.0.0.1:9", [ProxyConfig(name="direct")],
                          clock=clock) as (tracker, _):  # fmt: skip
        await trio.lowlevel.checkpoint()  # the setup (an SSL context, the store) is not a tick
        steps.on = True
        for at in instants:
            current[0] = at
            claimed += len(await tracker.claim_single())
        steps.on = False
    trio.lowlevel.remove_instrument(steps)
    longest, p99 = steps.summary()
    return longest, p99, claimed, steps.longest_task


def due_section(workdir: Path, sizes: list[int], rounds: int) -> dict[str, Any]:
    now = wall_ms()
    low, high = rules.due_range(now, rules.SINGLE_LOOKBACK_MS, 1000)
    blow, bhigh = rules.due_range(now, rules.BULK_LOOKBACK_MS, 15_000)
    out: dict[str, Any] = {}
    for size in sizes:
        db = workdir / f"due-{size}.db"
        t0 = time.perf_counter()
        conn = new_db(db)
        bulk_load_schedules(conn, schedule_rows(size, now))
        build = time.perf_counter() - t0
        plan = query_plan(conn)
        ours, base, ours_bulk, base_bulk = [], [], [], []
        calls = 2000
        for _ in range(rounds):
            ours.append(measure_due(conn, SINGLE_TYPES, low, high, SINGLE_LIMIT, calls))
            base.append(baseline("due", db=str(db), types=SINGLE_TYPES, low=low, high=high,
                                 limit=SINGLE_LIMIT, calls=calls))  # fmt: skip
            ours_bulk.append(measure_due(conn, BULK_TYPES, blow, bhigh, rules.BULK_LIMIT, 200))
            base_bulk.append(baseline("due", db=str(db), types=BULK_TYPES, low=blow, high=bhigh,
                                      limit=rules.BULK_LIMIT, calls=200))  # fmt: skip
        conn.close()
        out[size] = {
            "build_s": build,
            "plan": plan,
            "single_us": statistics.median(r[0] for r in ours),
            "single_p99_us": statistics.median(r[1] for r in ours),
            "single_rows": ours[0][2],
            "single_base_us": statistics.median(r["median_us"] for r in base),
            "bulk_us": statistics.median(r[0] for r in ours_bulk),
            "bulk_rows": ours_bulk[0][2],
            "bulk_base_us": statistics.median(r["median_us"] for r in base_bulk),
        }
        print(
            f"  {size:>10,} rows (built in {build:.0f} s): single-tick select "
            f"{out[size]['single_us']:.0f} µs median, p99 {out[size]['single_p99_us']:.0f} µs "
            f"({out[size]['single_rows']} rows) vs plain APSW {out[size]['single_base_us']:.0f} µs "
            f"= {ratio(out[size]['single_us'], out[size]['single_base_us'])}; bulk-tick select "
            f"{out[size]['bulk_us']:.0f} µs ({out[size]['bulk_rows']} rows) vs "
            f"{out[size]['bulk_base_us']:.0f} µs = "
            f"{ratio(out[size]['bulk_us'], out[size]['bulk_base_us'])}",
            flush=True,
        )
    largest = max(sizes)
    print(f"  plan at {largest:,} rows: " + " | ".join(out[largest]["plan"]))
    db = workdir / f"due-{largest}.db"
    longest, p99, claimed, longest_task = trio.run(claim_ticks, db, now, 60)
    inline = baseline("inline", db=str(db), types=SINGLE_TYPES, low=low, high=high,
                      limit=SINGLE_LIMIT, calls=200)  # fmt: skip
    out["loop_block"] = {
        "max_ms": longest,
        "p99_ms": p99,
        "claimed": claimed,
        "inline_max_ms": inline["max_ms"],
        "inline_p99_ms": inline["p99_ms"],
    }
    print(
        f"  loop block of the 1 s tick at {largest:,} rows (60 ticks, {claimed} claimed): "
        f"longest trio step {longest:.2f} ms ({longest_task}), p99 {p99:.2f} ms; baseline "
        f"(the select inline on the loop): longest {inline['max_ms']:.2f} ms, "
        f"p99 {inline['p99_ms']:.2f} ms",
        flush=True,
    )
    return out


# ---- 2. bulk path throughput ------------------------------------------------------------------

LOOSE = [Limit(requests=1_000_000, per=1.0)]  # type: ignore[arg-type]


async def bulk_path(db: Path, base: str) -> tuple[int, float, int]:
    """Claim → request → complete until nothing is due; (snapshots, seconds, requests)."""
    before = (await sim_stats(base))["requests"].get("bulk", 0)
    started = wall_ms()
    proxies = [ProxyConfig(name="direct", limits=LOOSE, bulk_limits=LOOSE)]
    async with tracker_on(db, base, proxies) as (tracker, _):
        t0 = time.perf_counter()
        limiter = trio.CapacityLimiter(BULK_CONCURRENCY)
        outcomes: list[str] = []

        async def run(group: list[ts.Due]) -> None:
            async with limiter:
                outcomes.append(await tracker.run_bulk(group))

        while claimed := await tracker.claim_bulk():
            async with trio.open_nursery() as nursery:
                for group in tracker.bulk_groups(claimed):
                    nursery.start_soon(run, group)
        elapsed = time.perf_counter() - t0
        stored = await tracker.store.read(
            lambda c: one(c, "SELECT count(*) FROM tracker_snapshots WHERE at_ms >= ?", (started,))[
                0
            ]
        )
    bad = [o for o in outcomes if o != "completed"]
    if bad:
        raise SystemExit(f"bulk path: {len(bad)} groups did not complete: {bad[:3]}")
    after = (await sim_stats(base))["requests"].get("bulk", 0)
    return stored, elapsed, after - before


def make_due(db: Path, count: int) -> None:
    """Plan every pending schedule of `db` within the bulk tick's window from now."""
    conn = apsw.Connection(str(db))
    now = wall_ms()
    with conn:
        conn.execute(
            "UPDATE tracker_schedules SET planned_ms = ? + (id * 70000) / ? - 60000"
            " WHERE status = 'pending'",
            (now, count),
        )
    conn.close()


def bulk_section(workdir: Path, songs: int, rounds: int) -> dict[str, Any]:
    with simulator(workdir, songs, "--limits", "none") as (base, aids):
        now = wall_ms()
        template = workdir / "bulk-template.db"
        conn = new_db(template)
        seed_songs(conn, aids, now, lambda i, aid: now - 60_000 + (i * 70_000) // len(aids))
        # the history snapshots are older than a day: only the new ones are counted
        conn.execute("pragma wal_checkpoint(TRUNCATE)")
        conn.close()
        ours, base_runs, same_runs, per_request = [], [], [], []
        for r in range(rounds):
            ours_db, base_db = workdir / f"bulk-ours-{r}.db", workdir / f"bulk-base-{r}.db"
            shutil.copy(template, ours_db)
            shutil.copy(template, base_db)
            same_db = workdir / f"bulk-same-{r}.db"
            shutil.copy(template, same_db)
            make_due(ours_db, len(aids))
            stored, seconds, requests = trio.run(bulk_path, ours_db, base)
            make_due(base_db, len(aids))
            ours.append(stored / seconds)
            per_request.append(stored / requests)
            base_runs.append(
                baseline("insert", db=str(base_db), now=wall_ms(), group=30, same=False)["rate"]
            )
            make_due(same_db, len(aids))
            same_runs.append(
                baseline("insert", db=str(same_db), now=wall_ms(), group=30, same=True)["rate"]
            )
            print(
                f"  round {r + 1}: bulk path {stored} snapshots in {seconds:.2f} s = "
                f"{ours[-1]:.0f}/s ({requests} requests); plain APSW {base_runs[-1]:.0f}/s, "
                f"with crawld's reads {same_runs[-1]:.0f}/s",
                flush=True,
            )
            for db in (ours_db, base_db, same_db):
                db.unlink()
        result = {
            "rate": statistics.median(ours),
            "base_rate": statistics.median(base_runs),
            "same_rate": statistics.median(same_runs),
            "per_request": statistics.median(per_request),
        }
        print(
            f"  snapshots/s through the bulk path {result['rate']:.0f} vs plain APSW "
            f"{result['base_rate']:.0f} = {ratio(result['rate'], result['base_rate'])}"
            f" (vs a plain APSW loop with crawld's per-row reads too, {result['same_rate']:.0f}/s:"
            f" {ratio(result['rate'], result['same_rate'])}); "
            f"snapshots per upstream request {result['per_request']:.1f} "
            f"(ideal: the group size, 30)",
            flush=True,
        )
        return result


# ---- 3. lag with a busy upstream ----------------------------------------------------------------


async def ticking(tracker: Tracker, seconds: float, *, bulk: bool) -> None:
    """The 1 s and (with `bulk`) 15 s ticks on the wall clock for `seconds`, then the snapshots
    already started finish."""
    clock = tracker.clock
    end = clock() + int(seconds * 1000)
    limiter = trio.CapacityLimiter(BULK_CONCURRENCY)

    async def every(period_ms: int, step: Callable[[trio.Nursery], Any]) -> None:
        at = clock()
        while at < end:
            await step(work)
            at += period_ms
            await sleep_until_ms(clock, at)

    async with trio.open_nursery() as work, trio.open_nursery() as ticks:
        ticks.start_soon(every, 1000, tracker.snapshot_tick)
        if bulk:
            ticks.start_soon(every, 15_000, functools.partial(tracker.bulk_tick, limiter=limiter))


async def plan_singles(tracker: Tracker, aids: list[int], start: int, seconds: float,
                       per_second: float) -> int:  # fmt: skip
    """Milestone and new schedules (alternating) at `per_second` over the run, exact times."""
    count = int(seconds * per_second)

    def tx(conn: apsw.Connection) -> int:
        for i in range(count):
            at = start + int(i * 1000 / per_second)
            type_ = "milestone" if i % 2 == 0 else "new"
            conn.execute(
                "INSERT INTO tracker_schedules(aid, type, planned_ms, created_ms)"
                " VALUES (?, ?, ?, ?)",
                (aids[(i * 7919) % len(aids)], type_, at, start),
            )
        return count

    return await tracker.store.write(tx)


def lag_figures(tracker: Tracker, types: list[str]) -> dict[str, dict[str, Any]]:
    out = {}
    for type_ in types:
        lags = [lag for _, lag in tracker.stats.lags.get(type_, [])]
        p50, p99 = rules.lag_percentiles(lags, (0.5, 0.99))
        out[type_] = {"count": len(lags), "p50_s": None if p50 is None else p50 / 1000,
                      "p99_s": None if p99 is None else p99 / 1000}  # fmt: skip
    return out


async def lag_run(
    db: Path, base: str, aids: list[int], seconds: float, *, busy: bool, normal_per_second: float
) -> dict[str, Any]:
    await sim_latency(base, *((50, 200) if busy else (0, 0)))
    before = await sim_stats(base)
    steps = StepTimes()
    trio.lowlevel.add_instrument(steps)
    proxies = [ProxyConfig(name="direct")]
    async with tracker_on(db, base, proxies, fresh_upstream=busy) as (tracker, delegate):
        start = wall_ms() + 2000
        if busy:  # normal schedules due at a steady rate over the run, for the bulk tick
            count = int(seconds * normal_per_second)

            def tx(conn: apsw.Connection) -> None:
                conn.executemany(
                    "INSERT INTO tracker_schedules(aid, type, planned_ms, created_ms)"
                    " VALUES (?, 'normal', ?, ?)",
                    ((aids[i % len(aids)], start + int(i * 1000 / normal_per_second), start)
                     for i in range(count)),
                )  # fmt: skip

            await tracker.store.write(tx)
        singles = await plan_singles(tracker, aids[len(aids) // 2 :], start, seconds - 5, 2.0)
        await sleep_until_ms(wall_ms, start)
        steps.on = True
        await ticking(tracker, seconds, bulk=busy)
        steps.on = False
        figures = lag_figures(tracker, ["milestone", "new", "normal"])
        proxy = delegate.status()[0]
        planned = await tracker.store.read(functools.partial(outcomes, start=start))
    trio.lowlevel.remove_instrument(steps)
    after = await sim_stats(base)
    requests = {k: v - before["requests"].get(k, 0) for k, v in after["requests"].items()}
    longest, p99 = steps.summary()
    return {
        "lags": figures,
        "outcomes": planned,
        "singles_planned": singles,
        "rejected_412": after["rejected_412"] - before["rejected_412"],
        "requests": requests,
        "skipped_limited": proxy["skipped_limited"],
        "loop_max_ms": longest,
        "loop_p99_ms": p99,
        "loop_longest_task": steps.longest_task,
    }


def outcomes(conn: apsw.Connection, *, start: int) -> dict[str, dict[str, Any]]:
    """What became of the schedules the run planned (created at `start`), per type: counts by
    status, and for the completed ones how long after the planned time they finished (the
    snapshot stored, request latency included)."""
    out: dict[str, dict[str, Any]] = {}
    for type_, status, n in conn.execute(
        "SELECT type, status, count(*) FROM tracker_schedules WHERE created_ms = ?"
        " GROUP BY type, status",
        (start,),
    ):
        out.setdefault(type_, {})[status] = n
    for type_, entry in out.items():
        late = [
            r[0]
            for r in conn.execute(
                "SELECT finished_ms - planned_ms FROM tracker_schedules WHERE created_ms = ?"
                " AND type = ? AND status = 'completed'",
                (start, type_),
            )
        ]
        p50, p99 = rules.lag_percentiles(late, (0.5, 0.99))
        entry["done_p50_s"] = None if p50 is None else p50 / 1000
        entry["done_p99_s"] = None if p99 is None else p99 / 1000
    return out


def lag_section(workdir: Path, songs: int, seconds: float, idle_seconds: float) -> dict[str, Any]:
    with simulator(workdir, songs, "--bulk-limits") as (base, aids):
        now = wall_ms()
        db = workdir / "lag.db"
        conn = new_db(db)
        # every song has its next regular snapshot somewhere in the next 12 h (not due in the run)
        seed_songs(conn, aids, now, lambda i, aid: now + HOUR + (i * 11 * HOUR) // len(aids))
        conn.close()
        busy = trio.run(functools.partial(lag_run, db, base, aids, seconds, busy=True,
                                          normal_per_second=15.0))  # fmt: skip
        idle = trio.run(functools.partial(lag_run, db, base, aids, idle_seconds, busy=False,
                                          normal_per_second=0.0))  # fmt: skip

    def show(name: str, run: dict[str, Any]) -> None:
        parts = []
        for type_, f in run["lags"].items():
            if f["count"]:
                parts.append(f"{type_} p50 {f['p50_s']:.2f} s p99 {f['p99_s']:.2f} s "
                             f"(n={f['count']})")  # fmt: skip
        for type_, entry in sorted(run["outcomes"].items()):
            counts = ", ".join(f"{k} {v}" for k, v in entry.items() if not k.startswith("done"))
            if entry["done_p99_s"] is not None:
                counts += (f"; finished {entry['done_p50_s']:.2f} s (p50) / "
                           f"{entry['done_p99_s']:.2f} s (p99) after the planned time")  # fmt: skip
            parts.append(f"{type_} planned: {counts}")
        print(f"  {name}: " + "; ".join(parts) + f"; requests {run['requests']}, "
              f"-412 answers {run['rejected_412']}, held back by the limiter "
              f"{run['skipped_limited']}x; longest loop step {run['loop_max_ms']:.1f} ms "
            f"({run['loop_longest_task']}) "
              f"(p99 {run['loop_p99_ms']:.2f} ms)", flush=True)  # fmt: skip

    show(f"busy upstream (50-200 ms, {songs:,} songs, 15 normal/s + 2 single/s, {seconds:.0f} s)",
         busy)  # fmt: skip
    show(f"baseline: idle upstream (0 ms, singles only, {idle_seconds:.0f} s)", idle)
    bulk_requests = busy["requests"].get("bulk", 0)
    normal = busy["lags"]["normal"]["count"]
    if bulk_requests:
        print(f"  busy run: {normal} bulk snapshots in {bulk_requests} bulk requests = "
              f"{normal / bulk_requests:.1f} per request", flush=True)  # fmt: skip
    return {"busy": busy, "idle": idle}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="10000,1000000,10000000")
    parser.add_argument("--bulk-songs", type=int, default=20_000)
    parser.add_argument("--songs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lag-seconds", type=float, default=90.0)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--keep", help="work directory to use and keep (default: a temporary one)")
    parser.add_argument("--only", choices=["due", "bulk", "lag"], action="append")
    args = parser.parse_args()
    sizes = [int(x) for x in args.rows.split(",")]
    only = set(args.only or ["due", "bulk", "lag"])
    with contextlib.ExitStack() as stack:
        if args.keep:
            workdir = Path(args.keep)
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-tracker-"))
            )
        results: dict[str, Any] = {}
        if "due" in only:
            print("Due query (1 s tick: milestone, new, archive; bulk tick: normal, archive):")
            results["due"] = due_section(workdir, sizes, args.rounds)
        if "bulk" in only:
            print(f"Bulk path ({args.bulk_songs:,} due normal schedules per round):")
            results["bulk"] = bulk_section(workdir, args.bulk_songs, args.rounds)
        if "lag" in only:
            print("Lag (wall clock, one round each):")
            results["lag"] = lag_section(workdir, args.songs, args.lag_seconds, args.idle_seconds)
        (workdir / "results.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
