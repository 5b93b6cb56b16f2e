"""Requests per second through crawld's HTTP edge, next to the same route without it.

Both servers answer `POST /ping` with a small JSON body from a Starlette app on hypercorn (trio),
each in its own process:

- baseline: a bare Starlette route, no checks at all (its process imports nothing from daemon);
- crawld: the route built by `daemon.api.app.build_app`, so every request passes the edge (head
  size, Host allow-list, Content-Length, API key among 2 keys in constant time, cross-site
  headers, JSON Content-Type, streamed body count and deadline) and the error handlers.

The client sends the same authenticated JSON POST on one keep-alive connection per thread;
rounds alternate between the servers and the medians are compared. The figure is the servers'
CPU time per request (from /proc/PID/stat), which a slow client cannot hide: the ratio is the price
of the edge on a route that does nothing else. Requests per second are printed too.

Usage: .venv/bin/python scripts/bench_edge.py [--requests N] [--rounds N] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import httpx

KEY = "bench-key-0123456789abcdef"

BASELINE = """
import sys, trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

async def ping(request: Request) -> Response:
    await request.body()
    return Response(b'{"ok":true}', media_type="application/json")

app = Starlette(routes=[Route("/ping", ping, methods=["POST"])])

async def main() -> None:
    assert not [m for m in sys.modules if m == "daemon" or m.startswith("daemon.")]
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(serve, app, config)
        print(urls[0].rsplit(":", 1)[1], flush=True)

trio.run(main)
"""

CANDIDATE = """
import os, sys, trio
from daemon import settings as config
from daemon.api.app import ApiRoute, build_app, json
from daemon.api.errors import read_json_body
from daemon.api.server import serve_app
from daemon.process import Daemon

os.environ["CRAWLD_BENCH_KEY"] = "other-key-0123456789abcdef, " + sys.argv[1]
cfg = config.decode('[http]\\nbind = "127.0.0.1:0"\\napi_key_env = "CRAWLD_BENCH_KEY"\\n')

async def ping(request):
    await read_json_body(request, dict)
    return json({"ok": True})

async def main() -> None:
    daemon = Daemon(cfg)
    app = build_app(daemon, [ApiRoute("POST", "/ping", ping, "ping")])
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(serve_app, app, "127.0.0.1:0")
        print(port, flush=True)

trio.run(main)
"""


def start(code: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", code, KEY], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    proc: subprocess.Popen[str], port: int, requests: int, threads: int
) -> tuple[float, float]:
    """(requests per second, server CPU microseconds per request) of one round."""
    cpu = cpu_seconds(proc.pid)
    per_second = rate(port, requests, threads)
    return per_second, (cpu_seconds(proc.pid) - cpu) * 1e6 / (requests * threads)


def rate(port: int, requests: int, threads: int) -> float:
    """Requests per second of `threads` clients, each sending `requests` on its own connection."""
    headers = {"Authorization": f"Bearer {KEY}", "Host": f"127.0.0.1:{port}"}
    url = f"http://127.0.0.1:{port}/ping"

    def client() -> None:
        with httpx.Client(headers=headers, trust_env=False) as c:
            for _ in range(requests):
                answer = c.post(url, json={"n": 1})
                assert answer.status_code == 200, answer.text

    workers = [threading.Thread(target=client) for _ in range(threads)]
    began = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return requests * threads / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="per thread and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    baseline, base_port = start(BASELINE)
    crawld, crawld_port = start(CANDIDATE)
    try:
        rate(base_port, 50, 1)  # warm both up
        rate(crawld_port, 50, 1)
        rounds: dict[str, list[tuple[float, float]]] = {"base": [], "crawld": []}
        for _ in range(args.rounds):
            rounds["base"].append(measure(baseline, base_port, args.requests, args.threads))
            rounds["crawld"].append(measure(crawld, crawld_port, args.requests, args.threads))
        rps = {k: statistics.median(r for r, _ in v) for k, v in rounds.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in rounds.items()}
        print(
            f"POST /ping, {args.threads} connections, median of {args.rounds} rounds of "
            f"{args.requests * args.threads} requests"
        )
        print(
            f"  baseline (bare Starlette): {cpu['base']:6.0f} µs CPU/request "
            f"({rps['base']:.0f} req/s)"
        )
        print(
            f"  crawld (edge + handlers):  {cpu['crawld']:6.0f} µs CPU/request "
            f"({rps['crawld']:.0f} req/s)   ratio {cpu['crawld'] / cpu['base']:.2f}"
        )
    finally:
        for proc in (baseline, crawld):
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
