"""LLM formats throughput: 200 pages through crawld's json format against the OpenAI-compatible
simulator answering in 300-600 ms, with [llm] max_concurrency = 8.

Processes: the generated site (`python -m daemon.fakes.site`), the simulator
(`python -m daemon.fakes.openai_compat --latency 0.3-0.6`, which reports the requests it served,
the most it had in flight and their mean latency at GET /_sim/stats), a fresh `crawld run`, and
the baseline. Figures, all from the same run:

- crawld pass 1: POST /v2/batch/scrape of N pages with a json format, timed to `completed`:
  pages/s against the ceiling 8 / mean latency (the simulator's own mean over that pass); goal
  >= 0.9 of the ceiling. The simulator's observed concurrency must never exceed 8.
- crawld pass 2: the same batch again: served from the answer cache, 0 model calls.
- baseline: a plain client in its own process (httpx + asyncio, importing nothing from
  `daemon`) sending N chat completions straight to the simulator, 8 at a time: what the
  endpoint gives a client with no crawl, no store and no limits in the way.

Usage: .venv/bin/python scripts/bench_llm.py [--pages 200] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = {"type": "object", "properties": {"title": {"type": "string"},
                                           "words": {"type": "integer"}}}  # fmt: skip

BASELINE = textwrap.dedent(
    """
    import asyncio, json, sys, time
    import httpx

    base, pages, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    schema = json.loads(sys.argv[4])

    async def main():
        gate = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=60, trust_env=False,
                                     limits=httpx.Limits(max_connections=concurrency)) as client:
            async def one(i):
                body = {"model": "sim", "messages": [
                    {"role": "system", "content": "Extract JSON."},
                    {"role": "user", "content": f"Page content:\\n# Baseline page {i}\\n"}],
                    "response_format": {"type": "json_schema", "json_schema": {
                        "name": "extract", "schema": schema, "strict": False}}}
                async with gate:
                    answer = await client.post(base + "/chat/completions", json=body)
                    answer.raise_for_status()
                    json.loads(answer.json()["choices"][0]["message"]["content"])
            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(pages)))
            print(json.dumps({"seconds": time.perf_counter() - t0}))

    asyncio.run(main())
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(url, timeout=2, trust_env=False)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def spawn(*args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL)  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def batch(client: httpx.Client, urls: list[str], llm: bool = True) -> tuple[float, dict]:
    formats = [{"type": "json", "schema": SCHEMA}] if llm else ["markdown"]
    t0, posted = time.perf_counter(), time.time()
    answer = client.post("/v2/batch/scrape", json={"urls": urls, "formats": formats})
    answer.raise_for_status()
    job = answer.json()["id"]
    while (status := client.get(f"/v2/batch/scrape/{job}", params={"limit": 1}).json())[
        "status"
    ] == "scraping":
        time.sleep(0.02)
    seconds = time.perf_counter() - t0
    done = client.get(f"/v2/batch/scrape/{job}").json()
    data = done["data"]
    while done.get("next"):
        done = client.get(done["next"]).json()
        data += done["data"]
    with_json = sum(1 for d in data if isinstance(d.get("json"), dict) and d["json"].get("title"))
    return seconds, {
        "status": status["status"],
        "pages": len(data),
        "with_json": with_json,
        "posted": posted,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8, help="[llm] max_concurrency")
    parser.add_argument("--crawl-concurrency", type=int, default=16, help="[crawl] concurrency")
    args = parser.parse_args()
    site_port, sim_port, port = free_port(), free_port(), free_port()
    site = f"http://127.0.0.1:{site_port}"
    sim = f"http://127.0.0.1:{sim_port}"
    procs = [
        spawn("-m", "daemon.fakes.site", "--bind", f"127.0.0.1:{site_port}",
              "--pages", str(args.pages + 1)),
        spawn("-m", "daemon.fakes.openai_compat", "--bind", f"127.0.0.1:{sim_port}",
              "--latency", "0.3-0.6"),
    ]  # fmt: skip
    tmp = tempfile.TemporaryDirectory(prefix="bench-llm-")
    try:
        wait_up(site + "/")
        wait_up(sim + "/_sim/stats")
        config = Path(tmp.name) / "crawld.toml"
        config.write_text(
            textwrap.dedent(f"""
            [daemon]
            state_dir = "state"
            log_level = "warning"
            [http]
            bind = "127.0.0.1:{port}"
            [collector]
            enabled = false
            [crawl]
            allow_cidrs = ["127.0.0.0/8"]
            concurrency = {args.crawl_concurrency}
            per_host_concurrency = {args.crawl_concurrency}
            [llm]
            base_url = "{sim}/v1"
            model = "sim"
            max_concurrency = {args.concurrency}
            timeout = "30s"
            """)
        )
        procs.append(spawn("-m", "daemon", "run", "--config", str(config)))
        wait_up(f"http://127.0.0.1:{port}/healthz")
        urls = [f"{site}/pages/{i}" for i in range(1, args.pages + 1)]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False,
                          timeout=60) as client:  # fmt: skip
            plain_seconds, _ = batch(client, urls, llm=False)
            httpx.post(sim + "/_sim/reset", trust_env=False)
            seconds, first = batch(client, urls)
            stats1 = httpx.get(sim + "/_sim/stats", trust_env=False).json()
            cached_seconds, second = batch(client, urls)
            stats2 = httpx.get(sim + "/_sim/stats", trust_env=False).json()
            usage = client.get("/v2/team/token-usage").json()["data"]
        httpx.post(sim + "/_sim/reset", trust_env=False)
        out = subprocess.run(
            [sys.executable, "-c", BASELINE, sim + "/v1", str(args.pages),
             str(args.concurrency), json.dumps(SCHEMA)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        base_seconds = json.loads(out.stdout.strip().splitlines()[-1])["seconds"]
        stats3 = httpx.get(sim + "/_sim/stats", trust_env=False).json()
    finally:
        for proc in reversed(procs):
            stop(proc)
        tmp.cleanup()
    n = args.pages
    rate = n / seconds
    ceiling = args.concurrency / stats1["mean_latency"]
    observed_ceiling = args.concurrency / stats1["mean_elapsed"]
    base_rate = n / base_seconds
    base_ceiling = args.concurrency / stats3["mean_latency"]
    print(f"pages: {n}, [llm] max_concurrency = {args.concurrency}, simulator latency 0.3-0.6 s")
    print(
        f"crawld pass 1: {first['pages']} pages ({first['with_json']} with json, status "
        f"{first['status']}) in {seconds:.2f} s = {rate:.2f} pages/s; model calls "
        f"{stats1['requests']}, mean latency {stats1['mean_latency'] * 1000:.0f} ms"
    )
    print(
        f"  ceiling {args.concurrency} / mean latency = {ceiling:.2f} pages/s -> "
        f"{rate / ceiling:.3f} of the ceiling (goal >= 0.9)"
    )
    print(
        f"  with the latency the simulator took in fact ({stats1['mean_elapsed'] * 1000:.0f} "
        f"ms, its own process included): ceiling {observed_ceiling:.2f} pages/s -> "
        f"{rate / observed_ceiling:.3f}"
    )
    print(
        f"  simulator's observed concurrency: max {stats1['max_in_flight']} "
        f"(limit {args.concurrency}); between its first request and last answer "
        f"({stats1['window_seconds']:.2f} s) the {args.concurrency} slots were busy "
        f"{stats1['busy_seconds'] / (args.concurrency * stats1['window_seconds']):.3f} of "
        f"the time"
    )
    lead = stats1["first_at"] - first["posted"]
    print(
        f"  from the POST to the first model request {lead:.2f} s; from the last answer to "
        f"`completed` {seconds - lead - stats1['window_seconds']:.2f} s"
    )
    print(
        f"  the same batch without the json format (markdown only): {plain_seconds:.2f} s = "
        f"{n / plain_seconds:.1f} pages/s"
    )
    print(
        f"crawld pass 2 (cache): {second['pages']} pages ({second['with_json']} with json) in "
        f"{cached_seconds:.2f} s = {n / cached_seconds:.1f} pages/s; model calls "
        f"{stats2['requests'] - stats1['requests']}"
    )
    print(
        f"baseline (plain httpx client, same endpoint, {args.concurrency} at a time): "
        f"{base_rate:.2f} requests/s = {base_rate / base_ceiling:.3f} of its ceiling "
        f"{base_ceiling:.2f}; crawld/baseline = {rate / base_rate:.3f}"
    )
    print(f"tokens counted: {usage['tokensUsed']} ({json.dumps(usage['providers'])})")
    ok = (rate / observed_ceiling >= 0.9 and stats1["max_in_flight"] <= args.concurrency
          and stats2["requests"] == stats1["requests"] and first["with_json"] == n
          and second["with_json"] == n)  # fmt: skip
    print("RESULT:", "ok" if ok else "BELOW GOAL")


if __name__ == "__main__":
    main()
