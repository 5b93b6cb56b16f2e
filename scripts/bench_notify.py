"""Wake-ups across cluster members (LISTEN/NOTIFY, daemon/store/wake.py): what an idle cluster
asks of PostgreSQL, and how long an event made on one instance waits for another's drainer.
This tree is measured against a baseline tree (default: the `main` branch, extracted with `git
archive` and run by the same interpreter) in the same run, each on a fresh schema of a PRIVATE
PostgreSQL server this script starts (initdb; pg_stat_statements preloaded), so nothing else
is counted and the shared server's configuration is never touched.

- Idle: three instances of the default configuration (crawl API on, collector and tracker off,
  `[cluster] lease` 10 s), started and left --settle s; then pg_stat_statements is reset and
  read again after --idle s: statements per second of the whole cluster (BEGIN and COMMIT
  included), transactions per second (pg_stat_database), and the most frequent statements.
  Heartbeats and lease renewals are needed work; they are shown on their own line.
- Latency: three instances (lease 10 s, `[crawl] concurrency` 1 each) crawl --pages pages of a
  site answering each tree page 200 ms after its request; the crawl is created on the first
  instance, whose drainer delivers the job's webhook events; every instance fetches pages and
  writes their `crawl.page` events. Per page: the time from the site's answer to the receiver
  getting its event (median, p90, max over --rounds crawls, interleaved). About two pages in
  three are fetched by another instance than the drainer's: those events reach the drainer
  through a wake-up across instances (after) or its next look (before: a poll, or the next
  page of its own).

Usage: .venv/bin/python scripts/bench_notify.py [--baseline main] [--idle 30] [--settle 8]
       [--pages 60] [--rounds 3] [--only idle|latency ...]
Needs initdb (apt-get install postgresql) and, run as root, a `postgres` user for the server.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.fakes.receiver import open_receiver  # noqa: E402
from daemon.fakes.site import SiteSim, serve_site  # noqa: E402
from tests.cluster.harness import CRAWLD_RUN, Instances, wait_for  # noqa: E402
from tests.store.test_postgres import PrivateServer  # noqa: E402

NAMES = ("a", "b", "c")
LEASE = "10s"
"""The default `[cluster] lease` (config.toml)."""
ANSWER_S = 0.2
"""Every tree page answers this long after its request arrived."""
NEEDED = ("cluster_members", "cluster_leases")
"""Statements on these tables are heartbeats and lease renewals: needed work."""


class StatsServer(PrivateServer):
    """A private server logging every statement, with pg_stat_statements loaded."""

    @property
    def log(self) -> Path:
        return self.data.parent / "server.log"

    def logged(self) -> int:
        """Statements logged so far (simple and extended protocol, BEGIN and COMMIT too)."""
        text = self.log.read_text(errors="replace")
        return text.count("LOG:  statement: ") + text.count("LOG:  execute ")

    def pg_ctl(self, action: str) -> None:
        options = (
            f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
            " -c max_connections=200 -c log_statement=all"
        )
        log = str(self.log)
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "-m", "fast", action
        )


@asynccontextmanager
async def private_server() -> AsyncIterator[StatsServer]:
    root = Path(tempfile.mkdtemp(prefix="crawld-bench-pg-"))
    try:
        server = StatsServer(root)
        server.pg_ctl("start")
        try:
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            yield server
        finally:
            server.pg_ctl("stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def extract(ref: str, into: Path) -> Path:
    """The files of commit `ref` of this repository, in `into`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def command_for(tree: Path | None) -> tuple[str, ...]:
    """What an instance runs: this tree's crawld, or the one in `tree`."""
    if tree is None:
        return CRAWLD_RUN
    code = (
        f"import sys; sys.path.insert(0, {str(tree)!r}); from daemon.__main__ import main;"
        " sys.exit(main(sys.argv[1:]))"
    )
    return ("-c", code, "run", "--config", "{config}")


@asynccontextmanager
async def cluster(
    server: StatsServer, root: Path, tree: Path | None, base: str = "", extra: str = ""
) -> AsyncIterator[Instances]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    instances = Instances(root / schema, server.dsn, schema, base=base, lease=LEASE)
    for name in NAMES:
        instances.add(name, extra, command=command_for(tree))
    try:
        async with trio.open_nursery() as nursery:
            for name in NAMES:
                nursery.start_soon(instances.start, name, 90)
        yield instances
    finally:
        await instances.aclose()


def counts(server: StatsServer) -> tuple[dict[str, int], int]:
    """(calls by statement, transactions) of the whole server since the last reset (utility
    statements such as BEGIN are missing once psycopg prepares them: the log counts those)."""
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query, sum(calls)::bigint FROM pg_stat_statements"
            " WHERE query NOT ILIKE '%pg_stat%' GROUP BY query"
        ).fetchall()
        (xacts,) = conn.execute(
            "SELECT sum(xact_commit + xact_rollback)::bigint FROM pg_stat_database"
        ).fetchone() or (0,)
    return {str(q): int(c) for q, c in rows}, int(xacts or 0)


def reset(server: StatsServer) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
        conn.execute("SELECT pg_stat_reset()")


async def idle_once(
    server: StatsServer, root: Path, tree: Path | None, args: argparse.Namespace
) -> dict[str, Any]:
    async with cluster(server, root, tree):
        await trio.sleep(args.settle)
        reset(server)
        _, x0 = counts(server)
        logged = server.logged()
        t0 = time.monotonic()
        await trio.sleep(args.idle)
        total = server.logged() - logged
        calls, x1 = counts(server)
        seconds = time.monotonic() - t0
    needed = sum(c for q, c in calls.items() if any(t in q for t in NEEDED))
    top = sorted(calls.items(), key=lambda kv: -kv[1])[:10]
    return {
        "statements_per_s": total / seconds,
        "transactions_per_s": (x1 - x0) / seconds,
        "needed_per_s": needed / seconds,
        "top": [(c / seconds, " ".join(q.split())[:110]) for q, c in top],
    }


async def latency_once(
    server: StatsServer, root: Path, tree: Path | None, args: argparse.Namespace
) -> list[float]:
    """Seconds from each page's answer to its event at the receiver, for one crawl."""
    sim = SiteSim(pages=args.pages, latency=(ANSWER_S, ANSWER_S), paragraphs=1)
    base = (
        '[crawl]\nallow_cidrs = ["127.0.0.0/8"]\nconcurrency = 1\n'
        '[webhooks]\nallow_cidrs = ["127.0.0.0/8"]\n'
    )
    async with trio.open_nursery() as nursery, open_receiver() as receiver:
        await nursery.start(serve_site, sim)
        async with cluster(server, root, tree, base) as instances:
            offset = time.time() - trio.current_time()  # the site's clock to the receiver's
            body = {
                "url": f"http://127.0.0.1:{sim.port}/pages/0",
                "crawlEntireDomain": True,
                "includePaths": ["^/pages/"],
                "limit": args.pages,
                "webhook": {"url": receiver.url(), "events": ["page", "completed"]},
            }
            response = await instances.http.post(instances.url("a") + "/v2/crawl", json=body)
            response.raise_for_status()
            job = str(response.json()["id"])

            async def ended() -> bool:
                return any(r.event.get("type") == "crawl.completed" for r in receiver.events(job))

            await wait_for(ended, 300, every=0.05)
        nursery.cancel_scope.cancel()
    answered = {}
    for hit in sim.hits:
        if hit.path.startswith("/pages/"):
            answered.setdefault(hit.path, hit.at + ANSWER_S + offset)
    waits = []
    for r in receiver.events(job):
        if r.event.get("type") != "crawl.page":
            continue
        for doc in r.event.get("data") or []:
            url = str((doc.get("metadata") or {}).get("sourceURL") or "")
            path = "/" + url.split("/", 3)[-1] if url.count("/") >= 3 else ""
            if path in answered:
                waits.append(r.arrived - answered[path])
    return waits


def summary(waits: list[float]) -> dict[str, Any]:
    waits = sorted(waits)
    if not waits:
        return {"pages": 0}
    return {
        "pages": len(waits),
        "median_ms": 1000 * statistics.median(waits),
        "p90_ms": 1000 * waits[int(0.9 * (len(waits) - 1))],
        "max_ms": 1000 * waits[-1],
    }


def _ratio(after: float, before: float) -> str:
    return f"{after / before:.2f}x" if before else "-"


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="crawld-bench-notify-") as tmp:
        root = Path(tmp)
        (root / "baseline").mkdir()
        tree = extract(args.baseline, (root / "baseline").resolve()) if args.baseline else None
        async with private_server() as server:
            trees = {"before": tree, "after": None}
            if "idle" in args.only:
                found = {k: await idle_once(server, root, t, args) for k, t in trees.items()}
                print(f"Idle 3-instance cluster, {args.idle:g} s (baseline: {args.baseline})")
                for key, got in found.items():
                    print(
                        f"  {key:6} {got['statements_per_s']:7.1f} statements/s"
                        f" {got['transactions_per_s']:6.1f} transactions/s"
                        f"  (heartbeats and lease renewals: {got['needed_per_s']:.1f} statements/s)"
                    )
                    for per_s, query in got["top"]:
                        print(f"           {per_s:6.2f}/s  {query}")
                b, a = found["before"], found["after"]
                statements = _ratio(a["statements_per_s"], b["statements_per_s"])
                xacts = _ratio(a["transactions_per_s"], b["transactions_per_s"])
                print(f"  after/before: statements {statements}, transactions {xacts}")
            if "latency" in args.only:
                pooled: dict[str, list[float]] = {k: [] for k in trees}
                for _ in range(args.rounds):  # interleaved: before, after, before, after
                    for key, t in trees.items():
                        pooled[key] += await latency_once(server, root, t, args)
                found = {k: summary(v) for k, v in pooled.items()}
                print(
                    f"Page answered -> its webhook event received, {args.pages} pages x"
                    f" {args.rounds} crawls, 3 instances, drainer on one (ms)"
                )
                for key, got in found.items():
                    if not got["pages"]:
                        print(f"  {key:6} no page events matched")
                        continue
                    print(
                        f"  {key:6} median {got['median_ms']:7.1f}  p90 {got['p90_ms']:7.1f}"
                        f"  max {got['max_ms']:7.1f}  ({got['pages']} pages)"
                    )
                if found["before"].get("pages") and found["after"].get("pages"):
                    print(
                        "  after/before median"
                        f" {_ratio(found['after']['median_ms'], found['before']['median_ms'])}"
                    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="main", help="git ref of the baseline tree")
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=8.0)
    parser.add_argument("--pages", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3, help="crawls per tree (latency)")
    parser.add_argument("--only", nargs="+", default=["idle", "latency"])
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
