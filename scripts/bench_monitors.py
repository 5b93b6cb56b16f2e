"""The monitors' scheduler at 10,000 monitors: how late checks start, and what it costs idle.

For each store (SQLite; PostgreSQL in a throwaway schema of $CRAWLD_BENCH_PG_DSN), `crawld run`
processes against the loopback fake site (`python -m daemon.fakes.site`, its own process):

1. idle: the baseline, an idle crawld with no monitors, and crawld with `--monitors` active
   monitors none of which is due within the next half hour ("hourly at :MM", MM at least 35
   minutes ahead; the jitter is at most 30 minutes). Both run side by side and are measured over
   the same `--window` seconds, `--rounds` times (which of the two is read first alternates): CPU
   as % of one core (utime + stime from /proc/PID/stat) and store operations per second (/status:
   the store's reads plus write jobs; every read of the idle scheduler is one statement). Medians.
2. lateness: a fresh crawld with `--monitors` monitors, a share `--every5` "every 5 minutes"
   (jitter up to 150 s) and the rest "hourly at :MM" with MM the first 5-minute mark after they
   are all created (jitter up to 30 minutes), each checking one page of the site: the span from
   MM is the busiest one, both kinds' checks coming due at once. For `--measure` seconds
   from then, every scheduled check due in that span (scheduledFor + the monitor's jitter) is
   read from the store afterwards: start lateness = the check's start (started_ms) minus its due
   time; claim lateness = its creation minus its due time. A check due but not started by the
   end counts as late by (end - due).

The baseline is a crawld process too (the issue's baseline: an idle crawld with no monitors); this
script only starts processes and reads their /status, /proc and store. Goal (issue #34): p99
start lateness <= 1 s beyond the jitter; idle overhead <= 1% of a core over the baseline.
Usage: .venv/bin/python scripts/bench_monitors.py [--stores sqlite,postgres] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from benchkit import free_port, wait_up

ROOT = Path(__file__).resolve().parents[1]
PG_DSN = os.environ.get("CRAWLD_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
SITE_PAGES = 150


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Crawld:
    """A `crawld run` process with a fresh state directory (and schema, on PostgreSQL)."""

    def __init__(self, store: str, tick: float, claim_batch: int) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-monitors-")
        self.port = free_port()
        self.store = store
        self.schema = f"bench_monitors_{uuid.uuid4().hex[:8]}"
        section = ""
        if store == "postgres":
            section = ('[store]\nkind = "postgres"\ndsn_env = "BENCH_PG_DSN"\n'
                       f'schema = "{self.schema}"\n')  # fmt: skip
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
            [crawl.browser]
            enabled = false
            [crawl]
            allow_cidrs = ["127.0.0.0/8"]
            concurrency = 32
            per_host_concurrency = 32
            [monitors]
            tick = "{tick}s"
            claim_batch = {claim_batch}
            check_concurrency = 1
            """)
            + section
        )
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        env["BENCH_PG_DSN"] = PG_DSN
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daemon", "run", "--config", str(config)],
            cwd=self.tmp.name, env=env,
        )  # fmt: skip
        self.base = f"http://127.0.0.1:{self.port}"
        wait_up(self.base + "/healthz")
        self.client = httpx.Client(base_url=self.base, trust_env=False, timeout=60)

    def sample(self) -> tuple[float, float, int]:
        """(monotonic time, CPU seconds, store operations so far)."""
        store = self.client.get("/status").json()["store"]
        return (
            time.monotonic(),
            cpu_seconds(self.proc.pid),
            store.get("reads", 0) + store["write_jobs"],
        )

    def create(self, bodies: list[dict[str, object]], threads: int = 8) -> float:
        """POST every body to /v2/monitor; the seconds it took."""
        started = time.monotonic()

        def post(body: dict[str, object]) -> None:
            answer = self.client.post("/v2/monitor", json=body)
            if answer.status_code != 200:
                raise RuntimeError(f"monitor not created: {answer.status_code} {answer.text}")

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(post, bodies))
        return time.monotonic() - started

    def checks(self) -> list[tuple[int, int | None, int | None, int]]:
        """(scheduled_ms, created_ms, started_ms, jitter_ms) of every scheduled check (after
        stop())."""
        sql = ("SELECT scheduled_ms, created_ms, started_ms, spec FROM monitor_checks"
               " WHERE trigger_kind = 'scheduled' AND status <> 'skipped_overlap'")  # fmt: skip
        if self.store == "postgres":
            import psycopg

            with psycopg.connect(PG_DSN, autocommit=True) as conn:
                conn.execute(f'SET search_path TO "{self.schema}"')
                rows = conn.execute(sql).fetchall()
        else:
            path = Path(self.tmp.name) / "state" / "crawld.db"
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
                rows = conn.execute(sql).fetchall()
        return [(r[0], r[1], r[2], int(json.loads(bytes(r[3])).get("jitter_ms", 0))) for r in rows]

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(60)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.store == "postgres":
            import psycopg

            with psycopg.connect(PG_DSN, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        self.tmp.cleanup()


def monitor(i: int, site: str, text: str) -> dict[str, object]:
    page = f"{site}/pages/{i % SITE_PAGES}"
    return {"name": f"m{i}", "schedule": {"text": text},
            "targets": [{"type": "scrape", "urls": [page]}]}  # fmt: skip


def minute_after(seconds: float, multiple: int = 1) -> int:
    """The minute of the hour `seconds` from now, rounded up to a multiple of `multiple`."""
    minute = (datetime.now(UTC) + timedelta(seconds=seconds)).minute
    return (minute + multiple - 1) // multiple * multiple % 60


@dataclass
class Idle:
    cpu_pct: dict[str, list[float]]
    ops_per_s: dict[str, list[float]]
    create_s: float


def idle(args: argparse.Namespace, store: str, site: str) -> Idle:
    """Side by side: an idle crawld with no monitors, and one with none due for 30 minutes."""
    quiet = minute_after(35 * 60)
    out = Idle({"baseline": [], "monitors": []}, {"baseline": [], "monitors": []}, 0.0)
    daemons = {"baseline": Crawld(store, args.tick, args.claim_batch)}
    try:
        daemons["monitors"] = Crawld(store, args.tick, args.claim_batch)
        bodies = [monitor(i, site, f"hourly at :{quiet:02d}") for i in range(args.monitors)]
        out.create_s = daemons["monitors"].create(bodies)
        time.sleep(args.window)  # the creations' aftermath (wake-ups, WAL) out of the way
        for round_ in range(args.rounds):
            order = list(daemons) if round_ % 2 == 0 else list(reversed(daemons))
            first = {k: daemons[k].sample() for k in order}
            time.sleep(args.window)
            last = {k: daemons[k].sample() for k in order}
            for key in order:
                (t0, c0, o0), (t1, c1, o1) = first[key], last[key]
                out.cpu_pct[key].append(100 * (c1 - c0) / (t1 - t0))
                out.ops_per_s[key].append((o1 - o0) / (t1 - t0))
        for d in daemons.values():
            d.stop()
    finally:
        for d in daemons.values():
            d.cleanup()
    return out


def lateness(args: argparse.Namespace, store: str, site: str, create_s: float) -> dict[str, object]:
    """Start and claim lateness (ms beyond the jitter) of the checks due in the measured span."""
    every5 = int(args.monitors * args.every5)
    daemon = Crawld(store, args.tick, args.claim_batch)
    try:
        # On a 5-minute mark: the span measured is the busiest, the hourly monitors' first
        # minutes and the 5-minute ones' jitter span (150 s) at once.
        fire = minute_after(create_s * 1.5 + 45, 1 if args.quick else 5)
        bodies = [monitor(i, site, "every 5 minutes" if i < every5 else f"hourly at :{fire:02d}")
                  for i in range(args.monitors)]  # fmt: skip
        daemon.create(bodies)
        now = datetime.now(UTC)
        start = now.replace(second=0, microsecond=0)
        while start.minute != fire or start < now:
            start += timedelta(minutes=1)
        begin_ms = int(start.timestamp() * 1000)
        end_ms = begin_ms + int(args.measure * 1000)
        time.sleep(max(0.0, end_ms / 1000 - time.time()) + 2)
        daemon.stop()
        checks = daemon.checks()
    finally:
        daemon.cleanup()
    started: list[float] = []
    claimed: list[float] = []
    missing = 0
    for scheduled, created, began, jitter in checks:
        due = scheduled + jitter
        if not begin_ms <= due < end_ms:
            continue
        claimed.append((created if created is not None else end_ms) - due)
        if began is None:
            missing += 1
        started.append((began if began is not None else end_ms) - due)
    return {"started": started, "claimed": claimed, "not_started": missing}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def report(store: str, quiet: Idle, late: dict[str, object], args: argparse.Namespace) -> None:
    cpu = {k: statistics.median(v) for k, v in quiet.cpu_pct.items()}
    ops = {k: statistics.median(v) for k, v in quiet.ops_per_s.items()}
    print(f"-- {store}: {args.monitors} monitors"
          f" ({quiet.create_s:.0f} s to create through the API)")  # fmt: skip
    print(
        f"idle CPU, % of a core   baseline {cpu['baseline']:6.2f}   with monitors "
        f"{cpu['monitors']:6.2f}   overhead {cpu['monitors'] - cpu['baseline']:+6.2f}"
        f"  (goal <= 1.00)  ratio {cpu['monitors'] / max(cpu['baseline'], 1e-9):.2f}x"
    )
    print(
        f"idle store ops/s        baseline {ops['baseline']:6.2f}   with monitors "
        f"{ops['monitors']:6.2f}   overhead {ops['monitors'] - ops['baseline']:+6.2f}"
    )
    print("  rounds CPU %: baseline", _runs(quiet.cpu_pct["baseline"]),
          "monitors", _runs(quiet.cpu_pct["monitors"]))  # fmt: skip
    started, claimed = late["started"], late["claimed"]
    assert isinstance(started, list) and isinstance(claimed, list)
    print(
        f"checks due in {args.measure:.0f} s: {len(started)} "
        f"(not started by the end: {late['not_started']})"
    )
    if not started:
        print("start lateness: no check was due")
        return
    print(f"start lateness beyond the jitter: median {statistics.median(started) / 1000:.3f} s,"
          f" p99 {pct(started, 0.99) / 1000:.3f} s, max {max(started) / 1000:.3f} s"
          " (goal p99 <= 1 s)")  # fmt: skip
    if claimed:
        print(f"claim lateness (check created):   median {statistics.median(claimed) / 1000:.3f} s,"
              f" p99 {pct(claimed, 0.99) / 1000:.3f} s")  # fmt: skip


def _runs(values: list[float]) -> str:
    return "(" + ", ".join(f"{v:.2f}" for v in values) + ")"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--monitors", type=int, default=10_000)
    parser.add_argument("--every5", type=float, default=0.2,
                        help="share of 'every 5 minutes' monitors (the rest hourly)")  # fmt: skip
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--rounds", type=int, default=5, help="idle windows")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per idle window")
    parser.add_argument("--measure", type=float, default=120.0,
                        help="seconds of due times whose checks are measured")  # fmt: skip
    parser.add_argument("--tick", type=float, default=5.0, help="[monitors] tick")
    parser.add_argument("--claim-batch", type=int, default=10, help="[monitors] claim_batch")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke check: 300 monitors, 2 short rounds, 40 s measured from"
                        " the next minute (not a 5-minute mark)"
                        )  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.monitors, args.rounds, args.window, args.measure = 300, 2, 3.0, 40.0
    port = free_port()
    site = subprocess.Popen(
        [sys.executable, "-m", "daemon.fakes.site", "--bind", f"127.0.0.1:{port}",
         "--pages", str(SITE_PAGES), "--paragraphs", "2"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_up(base + "/robots.txt")
        print(f"medians of {args.rounds} idle windows of {args.window:.0f} s (both daemons"
              f" measured in the same windows); [monitors] tick {args.tick:g} s,"
              f" claim_batch {args.claim_batch}; {args.every5:.0%} every 5 minutes,"
              " the rest hourly")  # fmt: skip
        for store in args.stores.split(","):
            quiet = idle(args, store, base)
            late = lateness(args, store, base, quiet.create_s)
            report(store, quiet, late, args)
    finally:
        site.terminate()
        site.wait(30)


if __name__ == "__main__":
    main()
