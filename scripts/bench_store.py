"""Small write transactions per second through the store, next to plain APSW in one thread.

The store's write path is what every part of crawld uses: `await store.write(fn)` from many trio
tasks, group-committed by one writer in a worker thread. The baseline is the simplest correct
alternative: one APSW connection in one thread committing each write on its own. Both use the
same schema, pragmas (WAL, synchronous=NORMAL) and number of writes. While the store runs, a probe
task measures how long the trio loop was blocked (the longest gap between its 1 ms wake-ups).

Usage: .venv/bin/python scripts/bench_store.py [--writes N] [--tasks N] [--synchronous normal|full]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import apsw
import trio

from daemon.store import open_store

SCHEMA = "CREATE TABLE IF NOT EXISTS bench(id INTEGER PRIMARY KEY, task INTEGER, body BLOB)"
BODY = b"x" * 200


def baseline(path: Path, writes: int, synchronous: str) -> float:
    conn = apsw.Connection(str(path))
    conn.execute("pragma journal_mode=wal")
    conn.execute(f"pragma synchronous={synchronous}")
    conn.execute(SCHEMA)
    start = time.perf_counter()
    for i in range(writes):
        with conn:
            conn.execute("INSERT INTO bench(task, body) VALUES (?, ?)", (i % 100, BODY))
    elapsed = time.perf_counter() - start
    conn.close()
    return writes / elapsed


async def through_store(
    path: Path, writes: int, tasks: int, synchronous: str
) -> tuple[float, float]:
    longest_block = 0.0
    async with open_store(path, synchronous=synchronous) as store:
        await store.write(lambda c: c.execute(SCHEMA))
        done = trio.Event()

        async def probe() -> None:
            nonlocal longest_block
            last = time.perf_counter()
            while not done.is_set():
                await trio.sleep(0.001)
                now = time.perf_counter()
                longest_block = max(longest_block, now - last - 0.001)
                last = now

        async def writer(task: int, count: int) -> None:
            for _ in range(count):
                await store.write(
                    lambda c: c.execute("INSERT INTO bench(task, body) VALUES (?, ?)", (task, BODY))
                )

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe)
            async with trio.open_nursery() as writers:
                per_task = writes // tasks
                for t in range(tasks):
                    writers.start_soon(writer, t, per_task)
            elapsed = time.perf_counter() - start
            done.set()
        stats = store.stats
        print(f"  store: {stats.transactions} transactions for {stats.write_jobs} writes, "
              f"largest group {stats.largest_group}")  # fmt: skip
    return (writes // tasks) * tasks / elapsed, longest_block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=20_000)
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--synchronous", choices=["normal", "full"], default="normal")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = baseline(Path(tmp) / "baseline.db", args.writes, args.synchronous)
        ours, blocked = trio.run(
            through_store, Path(tmp) / "store.db", args.writes, args.tasks, args.synchronous
        )
    print(f"writes: {args.writes}, synchronous={args.synchronous}")
    print(f"plain APSW loop, one thread, commit per write: {base:10.0f} writes/s  (baseline)")
    print(f"store.write from {args.tasks} trio tasks (group commit): {ours:10.0f} writes/s")
    print(f"ratio store/baseline: {ours / base:.2f}")
    print(f"longest trio loop block during the run: {blocked * 1000:.2f} ms")


if __name__ == "__main__":
    main()
