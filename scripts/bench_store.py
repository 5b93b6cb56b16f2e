"""Small write transactions per second through the store, next to plain APSW baselines.

The store's write path is what every part of crawld uses: `await store.write(fn)` from many trio
tasks, group-committed by one writer thread (savepoints only to retry after a job failed). Two
baselines, each in its own process that imports nothing from `daemon` (checked), same schema,
pragmas (WAL, `synchronous`) and rows:

- grouped: one APSW connection in one thread committing the writes 100 per transaction. It is the
  fastest reasonable code for the same durability, and the figure to reach (goal: >= 0.5x).
- per write: the same loop committing each write alone, the simplest correct code; compared with
  `store.write` awaited from one task, one write at a time (the latency an acknowledgement pays).

Three reference lines explain the figures, also in processes of their own without `daemon`:

- inline: the same 100 trio tasks with each group run on the trio thread, in one transaction
  without savepoints (the store's path when no job fails), no writer thread. It blocks the loop,
  so it is not a valid design, but it is the ceiling for any store that wakes one trio task per
  write and runs SQLite under the same GIL: trio's own cost per task step is in it, and nothing
  of the work overlaps.
- trio alone: the same 100 tasks, each parked and woken once per "write", with no database at
  all: what waking one task per write costs by itself, and the stall figure of a trio loop that
  busy (it repeats the writes for at least 0.3 s, as long as the idle ticker runs). The store's
  database work and these wake-ups share one GIL, so they run one after the other:
  1 / (1/grouped + 1/trio alone), printed next to it, bounds the store's rate even before the
  store adds anything of its own.
- idle ticker: the stall figure of a trio loop doing nothing else, the machine's own noise.

While the store runs, a ticker task wakes every 1 ms and records how late it woke: the longest
stall of the trio loop (goal: never > 5 ms). Rounds are interleaved, figures are medians.

Usage: .venv/bin/python scripts/bench_store.py [--writes N] [--tasks N] [--rounds N]
           [--synchronous normal full] [--dir PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import apsw

SCHEMA = "CREATE TABLE IF NOT EXISTS bench(id INTEGER PRIMARY KEY, task INTEGER, body BLOB)"
INSERT = "INSERT INTO bench(task, body) VALUES (?, ?)"
BODY = b"x" * 200
GROUP = 100


def _plain_connection(path: Path, synchronous: str) -> apsw.Connection:
    conn = apsw.Connection(str(path), statementcachesize=256)
    conn.execute("pragma journal_mode=wal")
    conn.execute(f"pragma synchronous={synchronous}")
    conn.execute(SCHEMA)
    return conn


def baseline_grouped(path: Path, writes: int, tasks: int, synchronous: str) -> dict[str, Any]:
    conn = _plain_connection(path, synchronous)
    start = time.perf_counter()
    for first in range(0, writes, GROUP):
        with conn:
            for i in range(first, min(first + GROUP, writes)):
                conn.execute(INSERT, (i % tasks, BODY))
    elapsed = time.perf_counter() - start
    conn.close()
    return {"rate": writes / elapsed}


def baseline_each(path: Path, writes: int, tasks: int, synchronous: str) -> dict[str, Any]:
    conn = _plain_connection(path, synchronous)
    start = time.perf_counter()
    for i in range(writes):
        with conn:
            conn.execute(INSERT, (i % tasks, BODY))
    elapsed = time.perf_counter() - start
    conn.close()
    return {"rate": writes / elapsed}


class StallTicker:
    """Wakes every 1 ms and keeps how late it woke at worst: the longest the trio loop was
    blocked while it ran (until cancelled, or until the `perf_counter` time `until`)."""

    def __init__(self) -> None:
        self.longest = 0.0

    async def run(self, until: float = float("inf")) -> None:
        import trio

        while time.perf_counter() < until:
            due = time.perf_counter() + 0.001
            await trio.sleep(0.001)
            self.longest = max(self.longest, time.perf_counter() - due)


def inline_trio(path: Path, writes: int, tasks: int, synchronous: str) -> dict[str, Any]:
    import trio

    conn = _plain_connection(path, synchronous)
    run = conn.cursor().execute
    waiting: list[tuple[Any, trio.lowlevel.Task]] = []
    ready = trio.Event()

    def abort(raise_cancel: Any) -> trio.lowlevel.Abort:
        return trio.lowlevel.Abort.FAILED

    async def committer() -> None:
        nonlocal ready
        while True:
            if not waiting:
                await ready.wait()
                ready = trio.Event()
                continue
            batch = waiting[:GROUP]
            del waiting[:GROUP]
            run("BEGIN")
            for fn, _ in batch:
                fn(conn)
            run("COMMIT")
            for _, task in batch:
                trio.lowlevel.reschedule(task)
            await trio.lowlevel.checkpoint()

    async def writer(task: int, count: int) -> None:
        for _ in range(count):
            waiting.append(
                (lambda c: c.execute(INSERT, (task, BODY)), trio.lowlevel.current_task())
            )
            ready.set()
            await trio.lowlevel.wait_task_rescheduled(abort)

    async def main() -> float:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(committer)
            start = time.perf_counter()
            async with trio.open_nursery() as writers:
                for t in range(tasks):
                    writers.start_soon(writer, t, writes // tasks)
            elapsed = time.perf_counter() - start
            nursery.cancel_scope.cancel()
        return elapsed

    elapsed = trio.run(main)
    conn.close()
    return {"rate": writes // tasks * tasks / elapsed}


def trio_alone(path: Path, writes: int, tasks: int, synchronous: str) -> dict[str, Any]:
    import trio

    waiting: list[trio.lowlevel.Task] = []
    parked: list[trio.lowlevel.Task] = []

    def abort(raise_cancel: Any) -> trio.lowlevel.Abort:
        return trio.lowlevel.Abort.SUCCEEDED

    async def waker() -> None:
        while True:
            if not waiting:
                parked.append(trio.lowlevel.current_task())
                await trio.lowlevel.wait_task_rescheduled(abort)
                continue
            batch = waiting[:GROUP]
            del waiting[:GROUP]
            for task in batch:
                trio.lowlevel.reschedule(task)
            await trio.lowlevel.checkpoint()

    async def writer(count: int) -> None:
        for _ in range(count):
            waiting.append(trio.lowlevel.current_task())
            if parked:
                trio.lowlevel.reschedule(parked.pop())
            await trio.lowlevel.wait_task_rescheduled(abort)

    async def main() -> tuple[float, float]:
        ticker = StallTicker()
        rounds = 0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waker)
            nursery.start_soon(ticker.run)
            await trio.sleep(0.01)
            start = time.perf_counter()
            while not rounds or time.perf_counter() - start < 0.3:  # as long as the idle ticker
                async with trio.open_nursery() as writers:
                    for _ in range(tasks):
                        writers.start_soon(writer, writes // tasks)
                rounds += 1
            elapsed = time.perf_counter() - start
            nursery.cancel_scope.cancel()
        return rounds * (writes // tasks * tasks) / elapsed, ticker.longest

    rate, longest = trio.run(main)
    return {"rate": rate, "stall_ms": longest * 1000}


def idle_ticker(path: Path, writes: int, tasks: int, synchronous: str) -> dict[str, Any]:
    import trio

    ticker = StallTicker()
    trio.run(ticker.run, time.perf_counter() + 0.3)
    return {"stall_ms": ticker.longest * 1000}


def store_run(path: Path, writes: int, tasks: int, synchronous: str) -> dict[str, Any]:
    import trio

    from daemon.store import open_store

    async def run() -> dict[str, Any]:
        ticker = StallTicker()
        async with open_store(path, synchronous=synchronous) as store:
            await store.write(lambda c: c.execute(SCHEMA))

            async def writer(task: int, count: int) -> None:
                for _ in range(count):
                    await store.write(lambda c: c.execute(INSERT, (task, BODY)))

            per_task = writes // tasks
            before = store.stats.transactions
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ticker.run)
                await trio.sleep(0.01)
                start = time.perf_counter()
                async with trio.open_nursery() as writers:
                    for t in range(tasks):
                        writers.start_soon(writer, t, per_task)
                elapsed = time.perf_counter() - start
                nursery.cancel_scope.cancel()
            transactions = store.stats.transactions - before
        return {
            "rate": per_task * tasks / elapsed,
            "stall_ms": ticker.longest * 1000,
            "writes_per_commit": per_task * tasks / max(transactions, 1),
        }

    return trio.run(run)


ROLES = {
    "grouped": baseline_grouped,
    "each": baseline_each,
    "store": store_run,
    "inline": inline_trio,
    "trio-alone": trio_alone,
    "idle": idle_ticker,
    "store-sequential": lambda path, writes, tasks, sync: store_run(path, writes, 1, sync),
}


def child(role: str, path: Path, writes: int, tasks: int, synchronous: str) -> None:
    if not role.startswith("store"):
        loaded = [m for m in sys.modules if m == "daemon" or m.startswith("daemon.")]
        assert not loaded, f"the baseline process imported {loaded}"
    print(json.dumps(ROLES[role](path, writes, tasks, synchronous)))


def measure(role: str, folder: Path, writes: int, tasks: int, synchronous: str) -> dict[str, Any]:
    path = folder / f"{role}-{synchronous}-{time.monotonic_ns()}.db"
    command = [sys.executable, __file__, "--child", role, "--db", str(path)]
    command += ["--writes", str(writes), "--tasks", str(tasks), "--synchronous", synchronous]
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root} if role.startswith("store") else dict(os.environ)
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--writes", type=int, default=20_000)
    parser.add_argument("--sequential-writes", type=int, default=3_000)
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--synchronous", nargs="+", choices=["normal", "full"])
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go")
    parser.add_argument("--child", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    modes = args.synchronous or ["normal", "full"]
    if args.child:
        child(args.child, args.db, args.writes, args.tasks, modes[0])
        return

    plan = [
        ("grouped", args.writes, args.tasks),
        ("store", args.writes, args.tasks),
        ("each", args.sequential_writes, 1),
        ("store-sequential", args.sequential_writes, 1),
        ("inline", args.writes, args.tasks),
        ("trio-alone", args.writes, args.tasks),
        ("idle", 0, 0),
    ]
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for round_no in range(args.rounds):
            for mode in modes:
                for role, writes, tasks in plan:
                    results.setdefault((role, mode), []).append(
                        measure(role, Path(tmp), writes, tasks, mode)
                    )
            print(f"round {round_no + 1}/{args.rounds} done", file=sys.stderr)

    def median(role: str, mode: str, key: str = "rate") -> float:
        return float(statistics.median(r[key] for r in results[(role, mode)]))

    def worst_stall(mode: str, *roles: str) -> float:
        return max(r["stall_ms"] for role in roles for r in results[(role, mode)])

    def line(label: str, rate: float, note: str = "") -> None:
        print(f"  {label:<46} {rate:10.0f} writes/s  {note}")

    print(
        f"writes: {args.writes} from {args.tasks} tasks, {args.sequential_writes} sequential; "
        f"medians of {args.rounds} interleaved rounds, each run in its own process"
    )
    for mode in modes:
        grouped, ours = median("grouped", mode), median("store", mode)
        each, sequential = median("each", mode), median("store-sequential", mode)
        inline = median("inline", mode)
        per_commit = median("store", mode, "writes_per_commit")
        print(f"synchronous={mode}")
        line(f"plain APSW, {GROUP} writes per commit (baseline)", grouped)
        line(
            f"store.write from {args.tasks} trio tasks",
            ours,
            f"{ours / grouped:.2f}x  ({per_commit:.0f} writes per commit)",
        )
        line("inline on the trio thread (reference)", inline, f"{inline / grouped:.2f}x")
        alone = median("trio-alone", mode)
        line(
            "trio alone, one wake-up per write (reference)",
            alone,
            f"{alone / grouped:.2f}x  (with the baseline's work after it: "
            f"{1 / (1 / grouped + 1 / alone) / grouped:.2f}x)",
        )
        line("plain APSW, commit per write (baseline)", each, f"({1e6 / each:.0f} us per write)")
        line(
            "store.write from 1 task, one at a time",
            sequential,
            f"{sequential / each:.2f}x  ({1e6 / sequential:.0f} us per write)",
        )
        print(
            f"  longest trio loop stall (1 ms ticker, store runs): "
            f"{worst_stall(mode, 'store', 'store-sequential'):.2f} ms; "
            f"trio alone: {worst_stall(mode, 'trio-alone'):.2f} ms; "
            f"idle loop on this machine: {worst_stall(mode, 'idle'):.2f} ms"
        )


if __name__ == "__main__":
    main()
