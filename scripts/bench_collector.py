"""Collector throughput end to end, next to raw aiormq publishing, plus peak memory for 100 tasks.

1. crawld: the Octoparse simulator (its own process, like a remote upstream) serves N recent
   rows; one run pages through them, filters them,
   writes them to the outbox and the AMQP drainer publishes them to RabbitMQ with publisher
   confirms. Timed from POST /crawl/start until every row is confirmed.
2. baseline: the same message bodies and properties (persistent, mandatory, per-message TTL,
   message ids) published with aiormq directly, `confirm_window` at a time concurrently, every
   confirm awaited: the cost of RabbitMQ alone.
3. memory: a `crawld run` subprocess with 100 tasks against the simulator; its peak RSS (VmHWM)
   once every task has finished a run.

Needs RabbitMQ (default amqp://guest:guest@127.0.0.1:5672/, or $CRAWLD_BENCH_AMQP_URL).
Usage: .venv/bin/python scripts/bench_collector.py [--rows N] [--window N] [--tasks N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

import aiormq
import httpx
import msgspec
import trio
from aiormq.abc import AbstractChannel

from daemon import config
from daemon.app import Daemon, run_daemon
from daemon.broker import delete_queue, split_password
from daemon.collector.queue import AmqpQueue
from daemon.fakes.octoparse import DEMO_PASSWORD
from daemon.systemd import Notifier

AMQP_URL = os.environ.get("CRAWLD_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")

CONFIG = """
[daemon]
state_dir = "{state}"
log_level = "warning"
[http]
bind = "127.0.0.1:{port}"
[broker]
kind = "amqp"
url = "{url}"
password_env = "BENCH_AMQP_PW"
queue = "{queue}"
confirm_window = {window}
[collector]
auto_start = {auto_start}
batch_size = 1000
interval = "1h"
[[collector.accounts]]
name = "sim"
base_url = "{base}"
username = "demo"
password_env = "BENCH_SIM_PW"
rate_limit = 1000
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


async def crawld_rows_per_s(base: str, sim_task: str, rows: int, window: int, state: Path) -> float:
    queue = f"bench-crawld-{uuid.uuid4().hex[:8]}"
    url, password = split_url(AMQP_URL)
    os.environ["BENCH_AMQP_PW"] = password
    path = state / "crawld.toml"
    path.write_text(
        CONFIG.format(state=state / "st", port=0, url=url, queue=queue, window=window,
                      base=base, auto_start="false")
        + TASK.format(i=0, task_id=sim_task)
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
            amqp: AmqpQueue = daemon.parts["queue"]
            with trio.fail_after(30):
                while amqp.broker is None or not amqp.broker.connected:
                    await trio.sleep(0.01)
            start = time.perf_counter()
            await http.post(api + "/crawl/start", json={"task_id": "t0"})
            with trio.fail_after(600):
                while amqp.published < rows:  # an attribute read: polling costs the daemon nothing
                    await trio.sleep(0.005)
            elapsed = time.perf_counter() - start
            daemon.request_stop()
    finally:
        await delete_queue(AMQP_URL, queue)
    return rows / elapsed


async def _raw_publish(bodies: list[bytes], window: int, queue: str) -> float:
    connection = await aiormq.connect(AMQP_URL)
    channel: AbstractChannel = await connection.channel(publisher_confirms=True)
    await channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "classic"})
    now = int(time.time())
    start = time.perf_counter()
    for first in range(0, len(bodies), window):
        batch = bodies[first : first + window]
        await asyncio.gather(
            *(
                channel.basic_publish(
                    body,
                    routing_key=queue,
                    mandatory=True,
                    properties=aiormq.spec.Basic.Properties(
                        content_type="application/json",
                        delivery_mode=2,
                        message_id=uuid.uuid4().hex,
                        expiration="604800000",
                        timestamp=datetime.fromtimestamp(now),
                        app_id="crawld",
                        headers={"task_id": "t0", "run_id": "r", "offset": first},
                    ),
                )
                for body in batch
            )
        )
    elapsed = time.perf_counter() - start
    await channel.queue_delete(queue)
    await connection.close()
    return len(bodies) / elapsed


def raw_rows_per_s(bodies: list[bytes], window: int) -> float:
    return asyncio.run(_raw_publish(bodies, window, f"bench-raw-{uuid.uuid4().hex[:8]}"))


async def peak_rss(sim: Simulator, tasks: int, state: Path) -> int:
    queue = f"bench-rss-{uuid.uuid4().hex[:8]}"
    url, password = split_url(AMQP_URL)
    port = _free_port()
    text = CONFIG.format(state=state / "rss", port=port, url=url, queue=queue, window=500,
                         base=sim.base, auto_start="true")  # fmt: skip
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
    sim = Simulator()
    ours: list[float] = []
    raw: list[float] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with httpx.AsyncClient() as http:
                await sim.wait_up(http)
                task_id = await sim.add_task(http, "bench", args.rows)
                bodies = await sim.bodies(http, task_id, args.rows)
            for round_ in range(args.rounds):  # interleaved: the broker's fsync rhythm drifts
                raw.append(await trio.to_thread.run_sync(raw_rows_per_s, bodies, args.window))
                state = Path(tmp) / f"round{round_}"
                state.mkdir()
                ours.append(
                    await crawld_rows_per_s(sim.base, task_id, args.rows, args.window, state)
                )
            rss_kb = await peak_rss(sim, args.tasks, Path(tmp))
    finally:
        sim.stop()
    raw_rate, our_rate = statistics.median(raw), statistics.median(ours)
    print(f"rows: {args.rows}, confirm window: {args.window}, medians of {args.rounds} rounds")
    print(f"raw aiormq publish with confirms (baseline): {raw_rate:8.0f} rows/s  {_runs(raw)}")
    print(f"crawld end to end (sim->filter->outbox->MQ): {our_rate:8.0f} rows/s  {_runs(ours)}")
    print(f"ratio crawld/raw: {our_rate / raw_rate:.2f}  (goal >= 0.8)")
    print(f"peak RSS of crawld with {args.tasks} tasks (300 rows each): {rss_kb / 1024:.1f} MiB")


def _runs(values: list[float]) -> str:
    return "(" + ", ".join(f"{v:.0f}" for v in values) + ")"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    trio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
