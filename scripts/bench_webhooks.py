"""Webhook events delivered in order per second, next to a plain httpx keep-alive POST loop.

Everything sends to the same receiver (`python -m daemon.fakes.receiver`, a separate process, so
its CPU is not ours), which checks the per-job order of everything that arrives.

- Baseline: a plain httpx keep-alive POST loop (trio + httpx.AsyncClient, the stack crawld uses)
  sending bodies of the same shape and size. It runs in its OWN process that imports nothing from
  `daemon` (checked), started fresh for every round; only its send loop is timed.
- Reference (not the goal's baseline): the same loop one layer down, each worker POSTing over its
  own httpcore keep-alive connection (no client, no connection pool), the layer crawld's drainers
  use; crawld is also shown as a fraction of it. Same process rules as the baseline.
- crawld: JobManager drainers with the durable outbox (jobs.store = true) and memory-only
  (jobs.store = false), signing with a whsec_ secret, the SSRF guard on, as in production.
- Two URL forms: an IP literal (http://127.0.0.1:PORT/hook) and a host name
  (http://localhost:PORT/hook, resolved by the SSRF guard, allow_cidrs = 127.0.0.0/8).
- Two shapes: 1 job of --events events; --jobs jobs x --per-job events under
  per_host_concurrency (the baseline runs that many loops at once).

Events are produced first, then the drainers start, so delivery is timed alone. Rounds
interleave every variant; medians are reported with ratios to the baseline of the same shape
and URL form.

Usage: .venv/bin/python scripts/bench_webhooks.py [--events N] [--jobs N] [--per-job N]
       [--per-host N] [--rounds N]
On a shared machine, run it while nothing else heavy runs (e.g. under a `flock`).
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

from benchkit import free_port

ROW = {"标题": "x" * 120, "链接": "https://example.com/item/123456", "发布时间": "2026-01-01 10:00"}
SECRET_ENV = "CRAWLD_BENCH_WEBHOOK_SECRET"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def baseline_process(
    kind: str, url: str, jobs: int, per_job: int, concurrency: int
) -> dict[str, Any]:
    """kind "httpx": the plain httpx loop (the baseline); "httpcore": the raw reference."""
    import httpcore
    import httpx
    import trio

    loaded = sorted(m for m in sys.modules if m == "daemon" or m.startswith("daemon."))
    assert not loaded, f"the baseline must not import crawld: {loaded}"

    def body(job: int, seq: int) -> bytes:
        # The shape and size of crawld's page event (compact JSON, same keys).
        event = {
            "success": True,
            "type": "crawl.page",
            "id": f"plain-{job:08d}-0000-0000-0000-000000000000",
            "webhookId": f"w{job:07d}-{seq:04d}-0000-0000-000000000000",
            "eventId": f"plain-{job:08d}-0000-0000-0000-000000000000:{seq}",
            "seq": seq,
            "data": [ROW],
            "metadata": {},
        }
        return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()

    bodies = [[body(j, s) for s in range(1, per_job + 1)] for j in range(jobs)]
    headers = {"Content-Type": "application/json"}

    async def run_raw() -> float:
        queue = list(reversed(range(jobs)))
        parsed = httpx.URL(url)
        target = httpcore.URL(
            scheme=parsed.raw_scheme, host=parsed.raw_host, port=parsed.port, target=parsed.raw_path
        )
        raw_headers = [(b"Host", parsed.netloc), (b"Content-Type", b"application/json")]

        async def worker() -> None:
            conn = httpcore.AsyncHTTPConnection(target.origin, keepalive_expiry=5.0)
            try:
                while queue:
                    for content in bodies[queue.pop()]:
                        headers = [*raw_headers, (b"Content-Length", str(len(content)).encode())]
                        request = httpcore.Request(
                            b"POST", target, headers=headers, content=content
                        )
                        response = await conn.handle_async_request(request)
                        try:
                            async for _ in response.aiter_stream():
                                pass
                        finally:
                            await response.aclose()
                        if not 200 <= response.status < 300:
                            raise RuntimeError(f"HTTP {response.status}")
            finally:
                await conn.aclose()

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(min(concurrency, jobs)):
                nursery.start_soon(worker)
        return time.perf_counter() - start

    async def run() -> float:
        if kind == "httpcore":
            return await run_raw()
        queue = list(reversed(range(jobs)))
        async with httpx.AsyncClient(
            trust_env=False, limits=httpx.Limits(max_connections=concurrency)
        ) as client:

            async def worker() -> None:
                while queue:
                    for content in bodies[queue.pop()]:
                        response = await client.post(url, content=content, headers=headers)
                        response.raise_for_status()

            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(min(concurrency, jobs)):
                    nursery.start_soon(worker)
            return time.perf_counter() - start

    elapsed = trio.run(run)
    return {"events": jobs * per_job, "seconds": elapsed}


def run_baseline(kind: str, url: str, jobs: int, per_job: int, concurrency: int) -> float:
    """Events/s of the baseline (or the raw reference), measured in a fresh process."""
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--baseline",
            kind,
            url,
            str(jobs),
            str(per_job),
            str(concurrency),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return float(result["events"] / result["seconds"])


# -- crawld --------------------------------------------------------------------------------------


async def run_crawld(
    url: str, jobs: int, per_job: int, per_host: int, durable: bool
) -> tuple[float, float]:
    """(events/s delivered, producer seconds per event) of crawld's drainers."""
    import trio

    from daemon.config import Duration, JobsConfig, WebhooksConfig, WebhookSpec
    from daemon.jobs.manager import JobManager
    from daemon.outbox import Outbox
    from daemon.store import open_store

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
    events = jobs * per_job
    return events / (delivered - produced), (produced - start) / events


async def receiver_call(base: str, path: str) -> dict[str, Any]:
    import httpx

    async with httpx.AsyncClient(trust_env=False) as client:
        method = "GET" if path == "summary" else "POST"
        response = await client.request(method, f"{base}/_receiver/{path}")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result


async def check_receiver(base: str, expected: int) -> None:
    summary = await receiver_call(base, "summary")
    if summary["violations"] or summary["delivered"] != expected:
        raise SystemExit(
            f"receiver saw problems: delivered {summary['delivered']} of {expected}, "
            f"violations {summary['violations'][:3]}"
        )
    await receiver_call(base, "reset")


async def bench(args: argparse.Namespace, port: int) -> None:
    import trio

    base = f"http://127.0.0.1:{port}"
    with trio.fail_after(30):
        while True:
            try:
                await receiver_call(base, "reset")
                break
            except Exception:  # httpx errors while the receiver starts
                await trio.sleep(0.05)
    urls = {"ip": f"http://127.0.0.1:{port}/hook", "name": f"http://localhost:{port}/hook"}
    shapes = {"one": (1, args.events, 1), "many": (args.jobs, args.per_job, args.per_host)}
    rates: dict[str, list[float]] = {}
    produce: dict[str, list[float]] = {}

    async def measure(key: str, variant: str, url: str, shape: tuple[int, int, int]) -> None:
        jobs, per_job, cap = shape
        if variant in BASELINES:
            rate = await trio.to_thread.run_sync(
                run_baseline, BASELINES[variant], url, jobs, per_job, cap
            )
        else:
            durable = variant == "durable"
            rate, per_event = await run_crawld(url, jobs, per_job, args.per_host, durable)
            produce.setdefault(key, []).append(per_event)
        await check_receiver(base, jobs * per_job)
        rates.setdefault(key, []).append(rate)

    # Warm-up (imports, connections, page cache); not counted.
    await measure("warm-plain", "plain", urls["ip"], (1, 200, 1))
    await measure("warm-durable", "durable", urls["ip"], (1, 200, 1))
    for _ in range(args.rounds):
        for shape_name, shape in shapes.items():
            for url_name, url in urls.items():
                for variant in ("plain", "raw", "durable", "memory"):
                    await measure(f"{shape_name}-{url_name}-{variant}", variant, url, shape)

    med = {key: statistics.median(values) for key, values in rates.items()}
    print(f"receiver: python -m daemon.fakes.receiver on 127.0.0.1:{port} (separate process)")
    print(f"medians of {args.rounds} interleaved rounds; baseline = plain httpx keep-alive POST")
    print("loop in its own process (imports nothing from daemon); the raw httpcore reference too")
    for shape_name, (jobs, per_job, cap) in shapes.items():
        title = (
            f"1 job x {per_job} events"
            if jobs == 1
            else f"{jobs} jobs x {per_job} events, per_host_concurrency={cap}"
        )
        print(title + ":")
        for url_name, url in urls.items():
            plain = med[f"{shape_name}-{url_name}-plain"]
            raw = med[f"{shape_name}-{url_name}-raw"]
            print(f"  {url}")
            print(f"    {'plain httpx loop (baseline)':<40} {plain:8.0f} events/s")
            reference = "raw httpcore, a connection per worker"
            print(f"    {reference:<40} {raw:8.0f} events/s  (reference)")
            for variant, label in VARIANTS:
                rate = med[f"{shape_name}-{url_name}-{variant}"]
                print(
                    f"    {label:<40} {rate:8.0f} events/s  ratio {rate / plain:5.2f}"
                    f"  ({rate / raw:4.2f} of raw)"
                )
    print("spread (min-max events/s over rounds):")
    for key in sorted(rates):
        if not key.startswith("warm"):
            print(f"  {key:<22} {min(rates[key]):8.0f} - {max(rates[key]):8.0f}")
    print("producer page() per event (durable vs memory):")
    for shape_name in shapes:
        d = statistics.median(produce[f"{shape_name}-ip-durable"]) * 1e6
        m = statistics.median(produce[f"{shape_name}-ip-memory"]) * 1e6
        print(f"  {shape_name:<5} {d:6.0f} us vs {m:6.0f} us")


VARIANTS = (("durable", "crawld, durable outbox"), ("memory", "crawld, memory only"))
BASELINES = {"plain": "httpx", "raw": "httpcore"}


def main() -> None:
    if sys.argv[1:2] == ["--baseline"]:
        kind, url, (jobs, per_job, concurrency) = sys.argv[2], sys.argv[3], map(int, sys.argv[4:7])
        print(json.dumps(baseline_process(kind, url, jobs, per_job, concurrency)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000, help="events of the single job")
    parser.add_argument("--jobs", type=int, default=100, help="concurrent jobs")
    parser.add_argument("--per-job", type=int, default=20, help="events per concurrent job")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians)")
    parser.add_argument("--per-host", type=int, default=8, help="per_host_concurrency")
    args = parser.parse_args()
    os.environ.setdefault(SECRET_ENV, SECRET)
    import trio

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon.fakes.receiver", "--bind", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        trio.run(bench, args, port)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
