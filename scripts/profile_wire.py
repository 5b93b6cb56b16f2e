"""Where the time of a webhook event and of a published row goes (issue 36), without a profiler.

- `webhooks`: one durable job of N events drained to the bundled receiver (its own process), as
  in scripts/bench_webhooks.py; each step of the drain is wrapped with a timer and printed per
  event: the outbox read (awaited, and its SQL in the reader thread), signing, the HTTP
  exchange, the ack (awaited, and its commit: in the writer thread, or on the trio thread when
  the store commits it there), the metrics/log step.
  The events' JSON is encoded when they are produced (stored as bytes), so it is not a step of
  the drain; the producer's cost per event is printed apart.
- `collector`: one run of N rows through the AMQP path of scripts/bench_collector.py under
  cProfile in every thread of the daemon (trio, store writer, the broker's asyncio thread,
  store readers), the functions with the most own CPU time, each with its share of all threads.

Wrapping adds a few microseconds per step, and cProfile slows pure-Python code more than C code:
read the shares, not the absolute figures. Needs what the benches need (RabbitMQ for
`collector`).

Usage: .venv/bin/python scripts/profile_wire.py webhooks [--events N]
       .venv/bin/python scripts/profile_wire.py collector [--rows N] [--top N]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import os
import pstats
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).parent))
import bench_collector
import bench_webhooks

SPENT: dict[str, float] = collections.defaultdict(float)


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[name] += time.perf_counter() - start

    return wrapper


def _timed_async(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Also the trio thread's CPU time while awaited (`name` + "_cpu"): this thread's own work
    in the step, the rest of the wall time being waits (other threads, the receiver)."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return await fn(*args, **kwargs)
        finally:
            SPENT[name] += time.perf_counter() - start
            SPENT[name + "_cpu"] += time.thread_time() - cpu

    return wrapper


WEBHOOK_STEPS = (
    ("read", "outbox read, awaited (reader thread + hand-over)"),
    ("read_sql", "  of which the SQL in the reader thread"),
    ("deliver", "deliver: until the event's final outcome"),
    ("sign", "  signing (HMAC-SHA256 twice, headers)"),
    ("http", "  HTTP exchange (request out, answer read)"),
    ("ack", "ack cursor, awaited (writer thread + hand-overs)"),
    ("commit", "  of which the commit in the writer thread"),
    ("commit_here", "  of which a commit on the trio thread (small write)"),
    ("final", "metrics and log line of the outcome"),
)


def _instrument_webhooks() -> None:
    from daemon import outbox
    from daemon.jobs import delivery, drainer, manager, signing
    from daemon.net import ssrf
    from daemon.store import writer

    drain = drainer.JobDrainer
    setattr(drain, "_send", _timed_async("deliver", drain._send))  # noqa: B010
    setattr(drain, "_write", _timed_async("ack", drain._write))  # noqa: B010
    setattr(drain, "_finalized", _timed("final", drain._finalized))  # noqa: B010
    setattr(writer.Store, "_commit_group", _timed("commit", writer.Store._commit_group))  # noqa: B010
    if hasattr(writer.Store, "_commit_here"):  # not in a tree from before it (PYTHONPATH)
        setattr(writer.Store, "_commit_here", _timed("commit_here", writer.Store._commit_here))  # noqa: B010
    setattr(writer.Store, "read", _timed_async("read", writer.Store.read))  # noqa: B010
    read_sql = _timed("read_sql", outbox.read_after_cursor)
    setattr(drainer, "outbox_mod", _Proxy(outbox, read_after_cursor=read_sql))  # noqa: B010
    sign = _timed("sign", signing.attempt_headers)
    setattr(delivery, "signing", _Proxy(signing, attempt_headers=sign))  # noqa: B010
    setattr(delivery, "ssrf", _Proxy(ssrf, send_vetted=_timed_async("http", ssrf.send_vetted)))  # noqa: B010
    run = manager.JobManager.run

    async def drain_only(self: Any, **kwargs: Any) -> None:
        SPENT.clear()  # the drain starts: what the producer spent is not counted
        await run(self, **kwargs)

    setattr(manager.JobManager, "run", drain_only)  # noqa: B010


class _Proxy:
    """A module with some functions replaced (for the module that imported it)."""

    def __init__(self, module: Any, **replaced: Any) -> None:
        self._module = module
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


async def _webhooks(events: int, port: int) -> None:
    base = f"http://127.0.0.1:{port}"
    with trio.fail_after(30):
        while True:
            try:
                await bench_webhooks.receiver_call(base, "reset")
                break
            except Exception:  # the receiver is starting
                await trio.sleep(0.05)
    url = f"{base}/hook"
    await bench_webhooks.run_crawld(url, 1, 200, 1, True)  # warm-up
    await bench_webhooks.check_receiver(base, 200)
    _instrument_webhooks()
    SPENT.clear()
    rate, produce = await bench_webhooks.run_crawld(url, 1, events, 1, True)
    await bench_webhooks.check_receiver(base, events)
    print(f"1 durable job x {events} events: {rate:.0f} events/s, {1e6 / rate:.0f} us per event")
    print(f"(producer before the drain: {produce * 1e6:.0f} us per event, encoding included)")
    print(f"  {'step (us per event)':<52} {'wall':>7} {'trio thread CPU':>16}")
    for key, label in WEBHOOK_STEPS:
        cpu = f"{SPENT[key + '_cpu'] / events * 1e6:16.1f}" if key + "_cpu" in SPENT else ""
        print(f"  {label:<52} {SPENT[key] / events * 1e6:7.1f}{cpu}")


def _profile_threads() -> tuple[list[cProfile.Profile], Callable[[], None]]:
    """Profile every thread started from now on, and this one, by the thread's CPU time (a wait
    costs nothing); returns (profiles, stop)."""
    profiles: list[cProfile.Profile] = []
    original_run = threading.Thread.run

    def run(self: threading.Thread) -> None:
        profile = cProfile.Profile(time.thread_time)
        profiles.append(profile)
        profile.enable()
        try:
            original_run(self)
        finally:
            profile.disable()

    main = cProfile.Profile(time.thread_time)
    profiles.append(main)
    threading.Thread.run = run  # type: ignore[method-assign]
    main.enable()

    def stop() -> None:
        main.disable()
        threading.Thread.run = original_run  # type: ignore[method-assign]

    return profiles, stop


async def _collector(rows: int, top: int) -> None:
    import httpx

    from daemon.fakes.octoparse import DEMO_PASSWORD

    os.environ["BENCH_SIM_PW"] = DEMO_PASSWORD
    sim = bench_collector.Simulator()
    args = argparse.Namespace(crawld_window=0, window=500, batches=2)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with httpx.AsyncClient() as http:
                await sim.wait_up(http)
                task = await sim.add_task(http, "profile", rows)
            warm = Path(tmp) / "warm"
            warm.mkdir()
            await bench_collector.crawld_rows_per_s(sim.base, task, rows, args, warm, "amqp")
            state = Path(tmp) / "profiled"
            state.mkdir()
            profiles, stop = _profile_threads()
            try:
                rate, cpu = await bench_collector.crawld_rows_per_s(
                    sim.base, task, rows, args, state, "amqp"
                )
            finally:
                stop()
    finally:
        sim.stop()
    per_row = cpu / rows * 1e6
    print(f"{rows} rows over AMQP under cProfile: {rate:.0f} rows/s, {per_row:.0f} us CPU/row")
    stats = pstats.Stats(profiles[0])
    for profile in profiles[1:]:
        if profile.getstats():
            stats.add(profile)
    entries = stats.stats  # type: ignore[attr-defined]
    total = sum(own for _, _, own, _, _ in entries.values())
    ranked = sorted(entries.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    print(f"CPU time of every thread: {total:.2f} s; top {top} functions by own CPU time:")
    for (path, line, name), (_, calls, own, cumulative, _) in ranked:
        where = f"{Path(path).name}:{line} {name}"
        print(f"  {own / total:6.1%}  {own:6.2f} s  cum {cumulative:6.2f} s  {calls:>8}  {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    hooks = sub.add_parser("webhooks")
    hooks.add_argument("--events", type=int, default=1000)
    rows = sub.add_parser("collector")
    rows.add_argument("--rows", type=int, default=10_000)
    rows.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    if args.what == "collector":
        trio.run(_collector, args.rows, args.top)
        return
    os.environ.setdefault(bench_webhooks.SECRET_ENV, bench_webhooks.SECRET)
    port = bench_webhooks.free_port()
    receiver = subprocess.Popen(
        [sys.executable, "-m", "daemon.fakes.receiver", "--bind", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        trio.run(_webhooks, args.events, port)
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)


if __name__ == "__main__":
    main()
