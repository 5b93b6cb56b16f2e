"""Webhook events delivered in order per second, next to a plain httpx POST loop.

Both send to the same receiver (`python -m daemon.fakes.receiver`, a separate process, so its
CPU is not ours) and the receiver checks the per-job order of everything that arrives.

- 1 job: crawld's drainer (durable outbox, then memory-only mode) against a plain loop that
  POSTs the same event bodies one after the other.
- N jobs: that many drainers at once under `per_host_concurrency` (all go to one host), against
  as many plain loops as that cap allows.
- The extra cost per event of the durable outbox: the producer's `page()` (a store transaction
  vs a memory queue) and the delivery (an ack transaction per event vs none).

Events are produced first, then the drainers start, so delivery is timed alone.

Usage: .venv/bin/python scripts/bench_webhooks.py [--events N] [--jobs N] [--per-job N]
       [--per-host N] [--rounds N] [--receiver HOST:PORT]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import msgspec
import trio

from daemon.config import Duration, JobsConfig, WebhooksConfig, WebhookSpec
from daemon.jobs.events import build_body, encode_body
from daemon.jobs.manager import JobManager
from daemon.outbox import Outbox
from daemon.store import open_store

ROW = {"标题": "x" * 120, "链接": "https://example.com/item/123456", "发布时间": "2026-01-01 10:00"}
SECRET_ENV = "CRAWLD_BENCH_WEBHOOK_SECRET"


class Run(msgspec.Struct):
    events: int
    produce_s: float
    deliver_s: float

    @property
    def rate(self) -> float:
        return self.events / self.deliver_s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def receiver_call(client: httpx.AsyncClient, base: str, path: str) -> dict:
    method = "GET" if path == "summary" else "POST"
    response = await client.request(method, f"{base}/_receiver/{path}")
    response.raise_for_status()
    result: dict = response.json()
    return result


async def check_receiver(client: httpx.AsyncClient, base: str, expected: int) -> None:
    summary = await receiver_call(client, base, "summary")
    if summary["violations"] or summary["delivered"] != expected:
        raise SystemExit(
            f"receiver saw problems: delivered {summary['delivered']} of {expected}, "
            f"violations {summary['violations'][:3]}"
        )
    await receiver_call(client, base, "reset")


async def crawld(url: str, jobs: int, per_job: int, per_host: int, durable: bool) -> Run:
    webhooks = WebhooksConfig(
        secret_env=SECRET_ENV,
        timeout=Duration(10),
        allow_cidrs=["127.0.0.0/8"],
        per_host_concurrency=per_host,
    )
    settings = JobsConfig(store=durable, memory_queue_size=per_job + 2)
    with tempfile.TemporaryDirectory() as tmp:
        async with open_store(Path(tmp) / "crawld.db") as store:
            manager = JobManager(store, Outbox(store), settings, webhooks)
            spec = WebhookSpec(url=url)
            start = time.perf_counter()
            ids = [await manager.create_job("crawl", webhook=spec, source={}) for _ in range(jobs)]
            for _ in range(per_job - 2):
                for job in ids:
                    await manager.page(job, [ROW])
            for job in ids:
                await manager.finish(job, "completed")
            produced = time.perf_counter()
            async with trio.open_nursery() as nursery:
                await nursery.start(manager.run)
                for job in ids:
                    await manager.wait_drained(job)
                nursery.cancel_scope.cancel()
            delivered = time.perf_counter()
    return Run(jobs * per_job, produced - start, delivered - produced)


async def plain_loop(url: str, jobs: int, per_job: int, concurrency: int) -> Run:
    bodies = [
        [
            encode_body(
                build_body(
                    kind="crawl",
                    name="page",
                    job_id=f"plain-{j}",
                    seq=seq,
                    webhook_id=f"w-{j}-{seq}",
                    data=[ROW],
                )
            )
            for seq in range(1, per_job + 1)
        ]
        for j in range(jobs)
    ]
    headers = {"Content-Type": "application/json"}
    queue = list(reversed(range(jobs)))
    async with httpx.AsyncClient(
        trust_env=False, limits=httpx.Limits(max_connections=concurrency)
    ) as client:

        async def worker() -> None:
            while queue:
                for body in bodies[queue.pop()]:
                    (await client.post(url, content=body, headers=headers)).raise_for_status()

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(min(concurrency, jobs)):
                nursery.start_soon(worker)
        elapsed = time.perf_counter() - start
    return Run(jobs * per_job, 0.0, elapsed)


def median(runs: list[Run]) -> Run:
    ordered = sorted(runs, key=lambda r: r.deliver_s)
    return ordered[len(ordered) // 2]


async def bench(args: argparse.Namespace, base: str) -> None:
    url = f"{base}/hook"
    async with httpx.AsyncClient(trust_env=False) as control:
        with trio.fail_after(30):
            while True:
                try:
                    await receiver_call(control, base, "summary")
                    break
                except httpx.HTTPError:
                    await trio.sleep(0.05)
        await receiver_call(control, base, "reset")

        async def measure(name: str, jobs: int, per_job: int, cap: int) -> Run:
            if name == "plain":
                run = await plain_loop(url, jobs, per_job, cap)
            else:
                run = await crawld(url, jobs, per_job, args.per_host, name == "durable")
            await check_receiver(control, base, jobs * per_job)
            return run

        await measure("plain", 1, 200, 1)  # warm-up: connections, imports, caches
        await measure("durable", 1, 200, 1)
        runs: dict[str, list[Run]] = {}
        scenarios = [("one", 1, args.events, 1), ("many", args.jobs, args.per_job, args.per_host)]
        # Rounds interleave the variants, and medians are reported: this box may be shared.
        for _ in range(args.rounds):
            for scenario, jobs, per_job, cap in scenarios:
                for name in ("plain", "durable", "memory"):
                    run = await measure(name, jobs, per_job, cap)
                    runs.setdefault(f"{scenario}-{name}", []).append(run)
    results = {key: median(value) for key, value in runs.items()}

    def line(label: str, run: Run, baseline: Run | None) -> str:
        ratio = f"{run.rate / baseline.rate:5.2f}" if baseline else "    -"
        return f"  {label:<48} {run.events:>6} events {run.rate:7.0f} /s  ratio {ratio}"

    print(f"receiver: python -m daemon.fakes.receiver at {base} (separate process)")
    print(f"medians of {args.rounds} interleaved rounds")
    print(f"1 job, {args.events} events in order:")
    one_plain = results["one-plain"]
    print(line("plain httpx POST loop (baseline)", one_plain, None))
    print(line("crawld drainer, durable outbox", results["one-durable"], one_plain))
    print(line("crawld drainer, memory only (jobs.store=false)", results["one-memory"], one_plain))
    many_plain = results["many-plain"]
    print(f"{args.jobs} jobs x {args.per_job} events, per_host_concurrency={args.per_host}:")
    print(line(f"{args.per_host} concurrent plain httpx POST loops (baseline)", many_plain, None))
    print(line(f"{args.jobs} crawld drainers, durable outbox", results["many-durable"], many_plain))
    print(line(f"{args.jobs} crawld drainers, memory only", results["many-memory"], many_plain))
    print("durable outbox vs memory only, per event:")
    for scenario in ("one", "many"):
        durable, memory = results[f"{scenario}-durable"], results[f"{scenario}-memory"]
        produce = (durable.produce_s - memory.produce_s) / durable.events * 1e6
        deliver = (durable.deliver_s - memory.deliver_s) / durable.events * 1e6
        label = "1 job" if scenario == "one" else f"{args.jobs} jobs"
        print(
            f"  {label:<8} producer page() {durable.produce_s / durable.events * 1e6:5.0f} us vs "
            f"{memory.produce_s / memory.events * 1e6:5.0f} us ({produce:+.0f} us); "
            f"delivery {deliver:+.0f} us per event"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000, help="events of the single job")
    parser.add_argument("--jobs", type=int, default=100, help="concurrent jobs")
    parser.add_argument("--per-job", type=int, default=20, help="events per concurrent job")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--per-host", type=int, default=8, help="per_host_concurrency")
    parser.add_argument("--receiver", help="use a receiver already running at HOST:PORT")
    args = parser.parse_args()
    os.environ.setdefault(SECRET_ENV, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    proc = None
    bind = args.receiver
    if bind is None:
        bind = f"127.0.0.1:{free_port()}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "daemon.fakes.receiver", "--bind", bind],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    try:
        trio.run(bench, args, f"http://{bind}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
