"""Each area's hot transaction through the store on PostgreSQL, next to raw psycopg.

The four transactions every nothing-lost argument rests on, built by the areas' own store
functions (daemon/*/store.py, daemon/outbox.py) exactly as the areas group them:

- collector window: a job's 500 rows, their 500 queue items pointing at them, the task's progress;
- webhook ack: a drainer's ack (cursor forward, the delivered event deleted);
- tracker bulk group: 30 claimed schedules completed from one bulk answer (snapshots, ETA rows,
  schedules finished, the next normal schedules placed in windows, counts kept by triggers);
- crawl page: a document stored as the job's row, its `page` event, the frontier entry done and
  10 found links admitted, the job's total.

Each runs `--n` times, one transaction at a time, `await store.write(fn)` from one trio task:
the cost a caller pays per transaction. The baseline is the same statements with the same
parameters in the same transactions, sent by a raw psycopg connection (RawCursor, autocommit off
by explicit BEGIN/COMMIT) in a process of its own that imports nothing from `daemon` (checked):
the statements are recorded once from the areas' functions, replayed by the baseline, so both
sides send exactly the same SQL (a many-row plain INSERT goes as one multi-row INSERT on both
sides, as the store's PostgreSQL backend sends it). Goal: store >= 0.7x raw for each. The same
store path on SQLite is printed too (the PostgreSQL/SQLite ratio). Each side gets a fresh schema
with the same set-up. Rounds are interleaved, figures are medians.

`--driver` compares the two ways to drive psycopg from trio (docs/explanations/store-contract.md).

Usage: .venv/bin/python scripts/bench_pg.py [--n N] [--rounds N] [--driver]
       ($CRAWLD_BENCH_PG_DSN, default postgresql://postgres@127.0.0.1:5432/postgres)
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

DSN = os.environ.get("CRAWLD_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
AREAS = ("collector window", "webhook ack", "tracker bulk group", "crawl page")


# ---- baseline child: raw psycopg, nothing from daemon ----------------------------------------


def baseline(script_path: Path, dsn: str, schema: str) -> None:
    import psycopg
    import psycopg.adapt

    assert not any(m == "daemon" or m.startswith("daemon.") for m in sys.modules), "imports daemon"
    with open(script_path, "rb") as f:
        script = pickle.load(f)
    conn = psycopg.Connection.connect(dsn, autocommit=True, cursor_factory=psycopg.RawCursor)
    from psycopg.types.numeric import Int8Dumper
    from psycopg.types.string import StrDumper

    class BoolAsInt(psycopg.adapt.Dumper):
        oid = psycopg.adapters.types["int8"].oid

        def dump(self, obj: Any) -> bytes:
            return b"1" if obj else b"0"

    conn.adapters.register_dumper(int, Int8Dumper)
    conn.adapters.register_dumper(str, StrDumper)
    conn.adapters.register_dumper(bool, BoolAsInt)
    conn.execute(f'SET search_path TO "{schema}"')
    results = {}
    for area, (setup, transactions) in script.items():
        _replay(conn, setup)
        start = time.perf_counter()
        _replay(conn, transactions)
        results[area] = len(transactions) / (time.perf_counter() - start)
    conn.close()
    print(json.dumps(results))


def _replay(conn: Any, transactions: list[list[tuple[str, str, Any]]]) -> None:
    for tx in transactions:
        conn.execute("BEGIN")
        for kind, sql, params in tx:
            cur = conn.cursor()
            rows = " RETURNING " in sql or sql.startswith("SELECT")
            if kind == "many":
                cur.executemany(sql, params, returning=rows)
                if rows:
                    for result in cur.results():
                        result.fetchall()
            else:
                cur.execute(sql, params or None)
                if cur.description is not None:
                    cur.fetchall()
        conn.execute("COMMIT")


# ---- the areas' transactions (parent process) -----------------------------------------------


def transactions(n: int) -> dict[str, tuple[Any, Any]]:
    """{area: (setup(conn), step(conn, i))} built from the areas' store functions."""
    import msgspec

    from daemon import outbox
    from daemon.collector import store as collector_store
    from daemon.collector.paging import ForwardProgress
    from daemon.config import WebhookFields
    from daemon.crawl.runs import store as crawl_store
    from daemon.jobs import store as job_store
    from daemon.tracker import store as tracker_store
    from daemon.tracker.bilibili import Stat

    now = 1_800_000_000_000
    body = msgspec.json.encode({"title": "x" * 200, "url": "https://example.com/a", "n": 1})

    def job(conn: Any, job_id: str, kind: str, webhook: Any = None) -> None:
        job_store.insert_job(conn, job_id=job_id, kind=kind, webhook=webhook, source={},
                             at_ms=now, expires_ms=now + 86_400_000)  # fmt: skip

    def collector_setup(conn: Any) -> None:
        job(conn, "cj", "crawl")

    # The crawler builds a window's items and rows before its write, as here.
    windows = [
        [outbox.NewItem(key=f"r{i}-{k}", body=body, meta={"task_id": "t"},
                        expires_ms=now + 3_600_000) for k in range(500)]
        for i in range(n)
    ]  # fmt: skip
    rows = [msgspec.Raw(body) for _ in range(500)]

    def collector_step(conn: Any, i: int) -> None:
        record = job_store.require_running(conn, "cj")
        first = job_store.add_rows(conn, record.id, rows, None)
        outbox.append(conn, "queue:job_data", windows[i], now, bodies_in=("cj", first))
        progress = ForwardProgress(start=0, cursor=(i + 1) * 500, total=10**6)
        collector_store.save_progress(conn, "t", progress, "run", "cj", now)

    def ack_setup(conn: Any) -> None:
        items = [outbox.NewItem(key=f"e{k}", body=body) for k in range(n)]
        outbox.append(conn, "webhook:wj", items, now)

    def ack_step(conn: Any, i: int) -> None:
        outbox.ack(conn, "webhook:wj", i + 1)

    aids = list(range(1000, 1000 + 30 * n))

    def bulk_setup(conn: Any) -> None:
        tracker_store.set_window_ms(conn, 300_000)
        for aid in aids:
            conn.execute("INSERT INTO tracker_videos(aid, title, status, added_ms)"
                         " VALUES (?, 't', 0, ?)", (aid, now))  # fmt: skip
            tracker_store.insert_snapshot(conn, aid, now - 3_600_000, _stat(Stat, 1000))
            conn.execute("INSERT INTO tracker_schedules(aid, type, planned_ms, created_ms)"
                         " VALUES (?, 'normal', ?, ?)", (aid, now, now))  # fmt: skip

    def bulk_step(conn: Any, i: int) -> None:
        group = aids[i * 30 : (i + 1) * 30]
        ids = [r[0] for r in conn.executemany(
            "SELECT id FROM tracker_schedules WHERE aid = ? AND status = 'pending'",
            [(a,) for a in group])]  # fmt: skip
        dues = tracker_store.claim(conn, ids, now, claimant="bench")
        stats = {aid: _stat(Stat, 5000 + aid) for aid in group}
        tracker_store.complete_bulk(conn, dues, stats, now + 1000, now + 1000, capacity=1000,
                                    rng=random.Random(i), claimant="bench")  # fmt: skip

    def crawl_setup(conn: Any) -> None:
        job(conn, "kj", "crawl", WebhookFields(url="https://hooks.example.com/crawl"))
        crawl_store.insert_job(conn, "kj", "crawl", "https://example.com/", b"{}")
        crawl_store.admit(conn, "kj", [(f"p{k}", f"https://example.com/p{k}", 1)
                                       for k in range(n)], 10**9)  # fmt: skip

    def crawl_step(conn: Any, i: int) -> None:
        n_ = i + 1
        if crawl_store.state_of(conn, "kj", n_) != "queued":
            raise RuntimeError("frontier out of step")
        record = job_store.require_running(conn, "kj")
        first = job_store.add_rows(conn, "kj", [{"markdown": "x" * 2000, "n": i}], None)
        seq = job_store.issue_seq(conn, record, "page")
        outbox.append(conn, job_store.stream_name("kj"),
                      [outbox.NewItem(key=f"kj:{seq}", body=body)], now)  # fmt: skip
        del first
        crawl_store.set_state(conn, "kj", n_, "done")
        links = [(f"q{i}-{k}", f"https://example.com/q{i}-{k}", 2) for k in range(10)]
        crawl_store.admit(conn, "kj", links, 10**9)
        job_store.set_total(conn, "kj", crawl_store.admitted(conn, "kj"))

    return {
        "collector window": (collector_setup, collector_step),
        "webhook ack": (ack_setup, ack_step),
        "tracker bulk group": (bulk_setup, bulk_step),
        "crawl page": (crawl_setup, crawl_step),
    }


def _stat(cls: Any, views: int) -> Any:
    return cls(views=views, danmakus=1, replies=2, likes=3, coins=4, shares=5, favorites=6)


class Recorder:
    """A store connection that runs and records each statement as PostgreSQL receives it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.log: list[tuple[str, str, Any]] = []

    def execute(self, sql: str, bindings: Any = ()) -> Any:
        from daemon.store.dialect import to_postgres

        self.log.append(("one", to_postgres(sql).sql, tuple(bindings or ())))
        return self.inner.execute(sql, bindings)

    def executemany(self, sql: str, seq: Any) -> Any:
        from daemon.store.dialect import bulk_inserts, to_postgres

        params = [tuple(p) for p in seq]
        statement = to_postgres(sql)
        if statement.bulk is not None and len(params) > 1:
            for text, flat in bulk_inserts(statement, params):
                self.log.append(("one", text, tuple(flat)))
        elif params:
            self.log.append(("many", statement.sql, params))
        return self.inner.executemany(sql, params)

    def changes(self) -> int:
        return int(self.inner.changes())


def record(n: int, schema: str) -> dict[str, tuple[list[Any], list[Any]]]:
    """The statements of each area's set-up and of its n transactions, on a scratch schema."""
    from daemon.store.postgres import PostgresBackend

    backend = PostgresBackend(DSN, schema=schema)
    conn = backend.connect()
    try:
        backend.migrate(conn)
        script = {}
        for area, (setup, step) in transactions(n).items():
            recorded: list[list[Any]] = []
            for i in [-1, *range(n)]:
                rec = Recorder(conn)
                conn.raw.execute("BEGIN")
                (setup(rec) if i < 0 else step(rec, i))
                conn.raw.execute("COMMIT")
                recorded.append(rec.log)
            script[area] = ([recorded[0]], recorded[1:])
    finally:
        conn.raw.close()
    return script


async def through_store(n: int, target: Any) -> dict[str, float]:
    from daemon.store import open_store

    results = {}
    async with open_store(target) as store:
        for area, (setup, step) in transactions(n).items():
            await store.write(setup)
            start = time.perf_counter()
            for i in range(n):
                await store.write(lambda c, i=i, step=step: step(c, i))
            results[area] = n / (time.perf_counter() - start)
    return results


async def driver_choice(n: int) -> dict[str, float]:
    """Transactions/s of one small write (BEGIN, an UPDATE, COMMIT) from trio: the sync driver in
    a worker thread (crawld's shape), psycopg's async API on the asyncio thread crawld runs for
    aiormq, and, for scale, the sync driver called on the trio thread (blocking the loop)."""
    import psycopg
    import trio

    from daemon.broker.asyncio_thread import open_asyncio_thread

    setup = "CREATE TEMP TABLE d(id INT PRIMARY KEY, n BIGINT); INSERT INTO d VALUES (1, 0)"
    sync = psycopg.Connection.connect(DSN, autocommit=True)
    sync.execute(setup)

    def tx() -> None:
        with sync.transaction():
            sync.execute("UPDATE d SET n = n + 1 WHERE id = 1")

    results = {}
    start = time.perf_counter()
    for _ in range(n):
        await trio.to_thread.run_sync(tx)
    results["sync driver, trio.to_thread"] = n / (time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(n):
        tx()
    results["sync driver on the trio thread (blocks it)"] = n / (time.perf_counter() - start)
    sync.close()

    async with open_asyncio_thread("bench") as loop:
        holder: dict[str, Any] = {}

        async def connect() -> None:
            holder["c"] = await psycopg.AsyncConnection.connect(DSN, autocommit=True)
            await holder["c"].execute(setup)

        async def atx() -> None:
            conn = holder["c"]
            async with conn.transaction():
                await conn.execute("UPDATE d SET n = n + 1 WHERE id = 1")

        async def close() -> None:
            await holder["c"].close()

        await loop.run(connect)
        start = time.perf_counter()
        for _ in range(n):
            await loop.run(atx)
        results["async driver on the asyncio thread"] = n / (time.perf_counter() - start)
        await loop.run(close)
    return results


def drop(schema: str) -> None:
    import psycopg

    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="transactions per area and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument(
        "--driver", action="store_true", help="only compare the two ways to drive psycopg"
    )
    args = parser.parse_args()
    if args.baseline:
        baseline(Path(args.baseline[0]), args.baseline[1], args.baseline[2])
        return
    if args.driver:
        import trio

        driver_runs: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, rate in trio.run(driver_choice, args.n * 10).items():
                driver_runs.setdefault(name, []).append(rate)
        print(f"one small write transaction at a time, {args.n * 10} per round, medians")
        for name, rates in driver_runs.items():
            print(f"{name:44s} {statistics.median(rates):8.0f} tx/s")
        return

    import trio

    from daemon.store.postgres import PostgresBackend

    runs: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = f"bench_rec_{uuid.uuid4().hex[:8]}"
        try:
            script = record(args.n, scratch)
        finally:
            drop(scratch)
        script_path = Path(tmp) / "script.pickle"
        script_path.write_bytes(pickle.dumps(script))
        for round_ in range(args.rounds):
            schema = f"bench_raw_{uuid.uuid4().hex[:8]}"
            setup_conn = PostgresBackend(DSN, schema=schema)
            conn = setup_conn.connect()
            setup_conn.migrate(conn)
            conn.raw.close()
            try:
                child = subprocess.run(
                    [sys.executable, __file__, "--baseline", str(script_path), DSN, schema],
                    capture_output=True, text=True,
                )  # fmt: skip
                if child.returncode != 0:
                    sys.exit(f"the baseline failed:\n{child.stderr}")
                out = child.stdout
                for area, rate in json.loads(out.strip().splitlines()[-1]).items():
                    runs.setdefault(("raw", area), []).append(rate)
            finally:
                drop(schema)
            schema = f"bench_store_{uuid.uuid4().hex[:8]}"
            try:
                got = trio.run(through_store, args.n, PostgresBackend(DSN, schema=schema))
                for area, rate in got.items():
                    runs.setdefault(("postgres", area), []).append(rate)
            finally:
                drop(schema)
            got = trio.run(through_store, args.n, Path(tmp) / f"r{round_}" / "crawld.db")
            for area, rate in got.items():
                runs.setdefault(("sqlite", area), []).append(rate)
    print(f"{args.n} transactions per area, one at a time; medians of {args.rounds} rounds")
    print(f"{'area':20s} {'store pg':>10s} {'raw psycopg':>12s} {'ratio':>7s}"
          f" {'store sqlite':>13s} {'pg/sqlite':>10s}")  # fmt: skip
    for area in AREAS:
        pg, raw, lite = (statistics.median(runs[k, area]) for k in ("postgres", "raw", "sqlite"))
        print(f"{area:20s} {pg:8.0f}/s {raw:10.0f}/s {pg / raw:6.2f}x {lite:11.0f}/s"
              f" {pg / lite:9.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
