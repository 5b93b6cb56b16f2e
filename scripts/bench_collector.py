"""Collector throughput end to end, next to raw publishing baselines, plus peak memory.

1. crawld, AMQP: the Octoparse simulator (its own process, like a remote upstream) serves N recent
   rows; one run pages through them, filters them, writes them to the outbox and the AMQP drainer
   publishes them to RabbitMQ with publisher confirms (at most `--window` unconfirmed). Timed from
   POST /crawl/start until every row is confirmed.
2. baselines, each in a process of its own that imports nothing from `daemon`
   (scripts/amqp_baseline.py asserts it runs on a stock asyncio loop): raw aiormq publishing the
   same bodies with the same properties (persistent, mandatory, expiration, message_id, 3
   headers), `--window` at a time concurrently, every confirm awaited; and a blocking-socket
   pamqp publisher with the same rule (RabbitMQ's ceiling here).
3. crawld, embedded queue: the same run with no broker (paging + filter + outbox only), timed until
   the run completed; at 10k and 100k rows its rate should not fall with the backlog.
4. memory: a `crawld run` subprocess with `--tasks` tasks against the simulator; its peak RSS
   (VmHWM) once every task has finished a run (skip with --tasks 0).

Rounds are interleaved (the broker's fsync rhythm drifts) and medians are printed with ratios.
5. `--stores sqlite,postgres`: each crawld run also on a PostgreSQL store (a fresh schema of
   $CRAWLD_BENCH_PG_DSN), printed next to the same run on SQLite.

Needs RabbitMQ (default amqp://guest:guest@127.0.0.1:5672/, or $CRAWLD_BENCH_AMQP_URL).
Usage: .venv/bin/python scripts/bench_collector.py [--rows N,N] [--window N] [--rounds N]
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
import uuid
from pathlib import Path

import httpx
import msgspec
import trio

from daemon import settings as config
from daemon.app import Daemon, run_daemon
from daemon.broker import delete_queue, split_password
from daemon.collector.crawler import TaskCrawler
from daemon.collector.queue import AmqpQueue
from daemon.collector.service import Collector
from daemon.fakes.octoparse import DEMO_PASSWORD
from daemon.systemd import Notifier

AMQP_URL = os.environ.get("CRAWLD_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")

CONFIG = """
[daemon]
state_dir = "{state}"
log_level = "warning"
[crawl.browser]
enabled = false
[http]
bind = "127.0.0.1:{port}"
[broker]
kind = "{kind}"
url = "{url}"
password_env = "BENCH_AMQP_PW"
queue = "{queue}"
confirm_window = {window}
batches_in_flight = {batches}
[collector]
auto_start = {auto_start}
batch_size = 1000
interval = "1h"
max_pending = {max_pending}
[[collector.accounts]]
name = "sim"
base_url = "{base}"
username = "demo"
password_env = "BENCH_SIM_PW"
rate_limit = 1000
"""

PG_DSN = os.environ.get("CRAWLD_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")

STORE_PG = """
[store]
kind = "postgres"
dsn_env = "BENCH_PG_DSN"
schema = "{schema}"
"""

TASK = """
[[collector.tasks]]
id = "t{i}"
account = "sim"
task_id = "{task_id}"
date_field = "发布时间"
"""


def split_url(url: str) -> tuple[str, str]:
    plain, password = split_password(url)
    return plain, password or "guest"


class Simulator:
    """`python -m daemon.fakes.octoparse` in a subprocess, driven through its /_sim API."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daemon.fakes.octoparse", "--bind", f"127.0.0.1:{self.port}",
             "--rows", "0"],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip

    async def wait_up(self, http: httpx.AsyncClient) -> None:
        with trio.fail_after(30):
            while True:
                try:
                    await http.get(self.base + "/_sim/stats")
                    return
                except httpx.HTTPError:
                    await trio.sleep(0.05)

    async def add_task(self, http: httpx.AsyncClient, name: str, rows: int) -> str:
        answer = await http.post(
            self.base + "/_sim/tasks", json={"name": name, "rows": rows, "days": 0.5}
        )
        return str(answer.json()["taskId"])

    async def bodies(self, http: httpx.AsyncClient, task_id: str, rows: int) -> list[bytes]:
        out: list[bytes] = []
        while len(out) < rows:
            page = await http.get(
                f"{self.base}/_sim/tasks/{task_id}/rows",
                params={"offset": len(out), "count": 10_000},
            )
            out.extend(msgspec.json.encode(row) for row in page.json()["rows"])
        return out

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


async def crawld_rows_per_s(
    base: str,
    sim_task: str,
    rows: int,
    args: argparse.Namespace,
    state: Path,
    kind: str,
    store: str = "sqlite",
) -> tuple[float, float]:
    """(rows/s, CPU seconds of the process) from POST /crawl/start until the last row is in."""
    queue = f"bench-crawld-{uuid.uuid4().hex[:8]}"
    schema = f"bench_collector_{uuid.uuid4().hex[:8]}"
    url, password = split_url(AMQP_URL)
    os.environ["BENCH_AMQP_PW"] = password
    path = state / "crawld.toml"
    path.write_text(
        CONFIG.format(state=state / "st", port=0, url=url, queue=queue,
                      window=args.crawld_window or args.window,
                      batches=args.batches, base=base, auto_start="false", kind=kind,
                      max_pending=max(20_000, rows + 1))
        + TASK.format(i=0, task_id=sim_task)
        + (STORE_PG.format(schema=schema) if store == "postgres" else "")
    )  # fmt: skip
    cfg = config.load(path)
    try:
        async with trio.open_nursery() as nursery, httpx.AsyncClient() as http:
            daemon: Daemon = await nursery.start(
                lambda task_status: run_daemon(
                    cfg, notifier=Notifier(None), task_status=task_status
                )
            )
            assert daemon.http_address is not None
            api = f"http://{daemon.http_address[0]}:{daemon.http_address[1]}"
            collector: Collector = daemon.parts["collector"]
            crawler = collector.crawler("t0")
            amqp: AmqpQueue | None = daemon.parts["queue"] if kind == "amqp" else None
            with trio.fail_after(30):
                while amqp is not None and (amqp.broker is None or not amqp.broker.connected):
                    await trio.sleep(0.01)
            start, cpu = time.perf_counter(), time.process_time()
            await http.post(api + "/crawl/start", json={"task_id": "t0"})
            with trio.fail_after(900):
                # attribute reads: polling costs the daemon nothing
                while (amqp.published if amqp else _stored(crawler)) < rows:
                    await trio.sleep(0.01)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            daemon.request_stop()
    finally:
        if kind == "amqp":
            await delete_queue(AMQP_URL, queue)
        if store == "postgres":
            drop_schema(schema)
    return rows / elapsed, cpu


def drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _stored(crawler: TaskCrawler) -> int:
    """Rows the crawler's finished run put in the outbox (0 while it runs)."""
    last = crawler.last_result
    return last.published if crawler.current is None and last is not None else 0


def write_bodies(bodies: list[bytes], path: Path) -> None:
    path.write_text(json.dumps([body.decode() for body in bodies], ensure_ascii=False))


async def baseline_rows_per_s(mode: str, bodies_file: Path, window: int) -> dict[str, float]:
    """One run of scripts/amqp_baseline.py in a fresh interpreter."""
    queue = f"bench-raw-{uuid.uuid4().hex[:8]}"
    script = Path(__file__).with_name("amqp_baseline.py")
    done = await trio.run_process(
        [sys.executable, str(script), mode, AMQP_URL, queue, str(bodies_file), str(window)],
        capture_stdout=True,
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


async def peak_rss(sim: Simulator, tasks: int, state: Path) -> int:
    queue = f"bench-rss-{uuid.uuid4().hex[:8]}"
    url, password = split_url(AMQP_URL)
    port = _free_port()
    text = CONFIG.format(state=state / "rss", port=port, url=url, queue=queue, window=500,
                         batches=2, base=sim.base, auto_start="true", kind="amqp",
                         max_pending=20_000)  # fmt: skip
    async with httpx.AsyncClient() as http:
        for i in range(tasks):
            text += TASK.format(i=i, task_id=await sim.add_task(http, f"rss{i}", 300))
    path = state / "rss.toml"
    path.write_text(text)
    env = {**os.environ, "BENCH_AMQP_PW": password, "BENCH_SIM_PW": DEMO_PASSWORD}
    proc = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, not awaited
        [sys.executable, "-m", "daemon", "run", "--config", str(path)], env=env
    )
    try:
        async with httpx.AsyncClient() as http:
            with trio.fail_after(300):
                while True:
                    try:
                        status = (await http.get(f"http://127.0.0.1:{port}/status")).json()
                        done = [t for t in status["collector"]["tasks"] if t["last_run"]]
                        if len(done) == tasks and status["collector"]["undelivered"] == 0:
                            break
                    except (httpx.HTTPError, KeyError, TypeError):
                        pass
                    await trio.sleep(0.1)
        status_text = await trio.Path(f"/proc/{proc.pid}/status").read_text()
        hwm = next(line for line in status_text.splitlines() if line.startswith("VmHWM"))
        return int(hwm.split()[1])
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        await delete_queue(AMQP_URL, queue)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def main_async(args: argparse.Namespace) -> None:
    os.environ["BENCH_SIM_PW"] = DEMO_PASSWORD
    os.environ["BENCH_PG_DSN"] = PG_DSN
    sim = Simulator()
    sizes = [int(n) for n in args.rows.split(",")]
    runs: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    rss_kb = 0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tasks: dict[int, tuple[str, Path]] = {}
            for rows in sizes:
                async with httpx.AsyncClient() as http:
                    await sim.wait_up(http)
                    task_id = await sim.add_task(http, f"bench{rows}", rows)
                    bodies_file = Path(tmp) / f"bodies{rows}.json"
                    write_bodies(await sim.bodies(http, task_id, rows), bodies_file)
                tasks[rows] = task_id, bodies_file
            # Interleaved, sizes included: the broker's fsync rhythm and the machine's load drift.
            for round_ in range(args.rounds):
                for rows, (task_id, bodies_file) in tasks.items():
                    for mode in filter(None, args.baselines.split(",")):
                        result = await baseline_rows_per_s(mode, bodies_file, args.window)
                        runs.setdefault((mode, rows), []).append(result["rows_per_s"])
                        cpu.setdefault((mode, rows), []).append(result["cpu_seconds"])
                    for kind in args.kinds.split(","):
                        for store in args.stores.split(","):
                            state = Path(tmp) / f"{kind}{store}{rows}r{round_}"
                            state.mkdir()
                            rate, seconds = await crawld_rows_per_s(
                                sim.base, task_id, rows, args, state, kind, store
                            )
                            key = kind if store == "sqlite" else f"{kind}+pg"
                            runs.setdefault((key, rows), []).append(rate)
                            cpu.setdefault((key, rows), []).append(seconds)
            if args.tasks:
                rss_kb = await peak_rss(sim, args.tasks, Path(tmp))
    finally:
        sim.stop()
    print(
        f"confirm window {args.window} (crawld: {args.crawld_window or args.window} in "
        f"{args.batches} batches in flight), "
        f"medians of {args.rounds} interleaved rounds; CPU is the process's seconds while timed"
    )
    labels = {
        "aiormq": "raw aiormq, plain asyncio loop (baseline)",
        "pamqp": "pamqp blocking socket (ceiling)",
        "amqp": "crawld end to end, AMQP",
        "embedded": "crawld end to end, embedded queue",
        "amqp+pg": "crawld end to end, AMQP, PostgreSQL store",
        "embedded+pg": "crawld end to end, embedded, PostgreSQL",
    }
    for rows in sizes:
        print(f"-- {rows} rows")
        for key, label in labels.items():
            if (key, rows) not in runs:
                continue
            rate = statistics.median(runs[key, rows])
            line = f"{label:44s} {rate:8.0f} rows/s  CPU {statistics.median(cpu[key, rows]):5.2f}s"
            if key.startswith("amqp") and ("aiormq", rows) in runs:
                line += f"  {rate / statistics.median(runs['aiormq', rows]):.2f}x raw aiormq"
            sqlite_key = key.removesuffix("+pg")
            if key.endswith("+pg") and (sqlite_key, rows) in runs:
                line += f"  {rate / statistics.median(runs[sqlite_key, rows]):.2f}x on SQLite"
            print(f"{line}  {_runs(runs[key, rows])}")
    if len(sizes) > 1 and all(("embedded", n) in runs for n in sizes):
        small, large = (
            statistics.median(runs["embedded", sizes[0]]),
            statistics.median(runs["embedded", sizes[-1]]),
        )
        print(f"embedded queue, {sizes[-1]} rows vs {sizes[0]}: {large / small:.2f}x (goal >= 0.9)")
    if rss_kb:
        mib = rss_kb / 1024
        print(f"peak RSS of crawld with {args.tasks} tasks (300 rows each): {mib:.1f} MiB")


def _runs(values: list[float]) -> str:
    return "(" + ", ".join(f"{v:.0f}" for v in values) + ")"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", default="10000,100000", help="comma-separated row counts")
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--batches", type=int, default=2, help="crawld's batches_in_flight")
    parser.add_argument(
        "--crawld-window",
        type=int,
        default=0,
        help="crawld's confirm_window if not --window (e.g. 1000 = two 500-windows in flight)",
    )
    parser.add_argument("--baselines", default="aiormq,pamqp")
    parser.add_argument("--kinds", default="amqp,embedded")
    parser.add_argument(
        "--stores", default="sqlite", help="sqlite,postgres: also run crawld on PostgreSQL"
    )
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    trio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
