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

Rounds (`--rounds`, default 3) give crawld and the baseline new pages each, alternating which
goes first; medians of the per-round ratios are reported.

Usage: .venv/bin/python scripts/bench_llm.py [--pages 200] [--rounds 3] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
from benchkit import free_port, wait_up

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


def sim_stats(sim: str) -> dict:
    return dict(httpx.get(sim + "/_sim/stats", trust_env=False).json())


def reset(sim: str) -> None:
    httpx.post(sim + "/_sim/reset", trust_env=False)


def baseline(sim: str, pages: int, concurrency: int) -> float:
    """Seconds the baseline process took for `pages` completions."""
    out = subprocess.run(
        [sys.executable, "-c", BASELINE, sim + "/v1", str(pages), str(concurrency),
         json.dumps(SCHEMA)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def config_text(port: int, sim: str, args: argparse.Namespace) -> str:
    return textwrap.dedent(f"""
        [daemon]
        state_dir = "state"
        log_level = "warning"
        [http]
        bind = "127.0.0.1:{port}"
        [collector]
        enabled = false
        [crawl.browser]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3,
                        help="crawld and baseline passes, alternating who goes first")  # fmt: skip
    parser.add_argument("--concurrency", type=int, default=8, help="[llm] max_concurrency")
    parser.add_argument("--crawl-concurrency", type=int, default=16, help="[crawl] concurrency")
    args = parser.parse_args()
    n = args.pages
    site_port, sim_port, port = free_port(), free_port(), free_port()
    site = f"http://127.0.0.1:{site_port}"
    sim = f"http://127.0.0.1:{sim_port}"
    procs = [
        spawn("-m", "daemon.fakes.site", "--bind", f"127.0.0.1:{site_port}",
              "--pages", str(n * args.rounds + 1)),
        spawn("-m", "daemon.fakes.openai_compat", "--bind", f"127.0.0.1:{sim_port}",
              "--latency", "0.3-0.6"),
    ]  # fmt: skip
    tmp = tempfile.TemporaryDirectory(prefix="bench-llm-")
    crawld: list[tuple[float, dict, dict]] = []  # (seconds, batch summary, simulator stats)
    base: list[tuple[float, dict]] = []  # (seconds, simulator stats)
    try:
        wait_up(site + "/")
        wait_up(sim + "/_sim/stats")
        config = Path(tmp.name) / "crawld.toml"
        config.write_text(config_text(port, sim, args))
        procs.append(spawn("-m", "daemon", "run", "--config", str(config)))
        wait_up(f"http://127.0.0.1:{port}/healthz")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False,
                          timeout=60) as client:  # fmt: skip
            first_urls = [f"{site}/pages/{i}" for i in range(1, n + 1)]
            plain_seconds, _ = batch(client, first_urls, llm=False)
            # Each round its own pages (new content: nothing from the answer cache); who goes
            # first alternates, so the machine's drift hits both alike.
            for r in range(args.rounds):
                urls = [f"{site}/pages/{i}" for i in range(r * n + 1, (r + 1) * n + 1)]
                for who in ("crawld", "baseline") if r % 2 == 0 else ("baseline", "crawld"):
                    reset(sim)
                    if who == "crawld":
                        seconds, summary = batch(client, urls)
                        crawld.append((seconds, summary, sim_stats(sim)))
                    else:
                        seconds = baseline(sim, n, args.concurrency)
                        base.append((seconds, sim_stats(sim)))
            reset(sim)
            cached_seconds, cached = batch(client, first_urls)
            cached_calls = sim_stats(sim)["requests"]
            usage = client.get("/v2/team/token-usage").json()["data"]
    finally:
        for proc in reversed(procs):
            stop(proc)
        tmp.cleanup()
    report(args, crawld, base, plain_seconds, (cached_seconds, cached, cached_calls), usage)


def report(
    args: argparse.Namespace,
    crawld: list[tuple[float, dict, dict]],
    base: list[tuple[float, dict]],
    plain_seconds: float,
    cached_pass: tuple[float, dict, int],
    usage: dict,
) -> None:
    n, c = args.pages, args.concurrency
    of_ceiling = [n / secs / (c / stats["mean_latency"]) for secs, _, stats in crawld]
    of_observed = [n / secs / (c / stats["mean_elapsed"]) for secs, _, stats in crawld]
    base_of_ceiling = [n / secs / (c / stats["mean_latency"]) for secs, stats in base]
    versus = [(n / cs) / (n / bs) for (cs, _, _), (bs, _) in zip(crawld, base, strict=True)]
    print(f"pages: {n} a round, {args.rounds} rounds, [llm] max_concurrency = {c}, "
          "simulator latency 0.3-0.6 s")  # fmt: skip
    for r, ((secs, summary, stats), (bsecs, _)) in enumerate(zip(crawld, base, strict=True)):
        lead = stats["first_at"] - summary["posted"]
        print(
            f"round {r + 1}: crawld {summary['pages']} pages ({summary['with_json']} with json, "
            f"{summary['status']}) in {secs:.2f} s = {n / secs:.2f} pages/s, "
            f"{of_ceiling[r]:.3f} of {c} / mean latency ({stats['mean_latency'] * 1000:.0f} ms), "
            f"{of_observed[r]:.3f} of it with the latency the simulator took in fact; "
            f"max in flight {stats['max_in_flight']}, slots busy "
            f"{stats['busy_seconds'] / (c * stats['window_seconds']):.3f}; POST to first call "
            f"{lead:.2f} s, last answer to `completed` "
            f"{secs - lead - stats['window_seconds']:.2f} s; baseline {n / bsecs:.2f}/s "
            f"({base_of_ceiling[r]:.3f} of its ceiling)"
        )
    med = statistics.median
    print(f"crawld median: {med(of_ceiling):.3f} of the ceiling (goal >= 0.9), "
          f"{med(of_observed):.3f} with the observed latency")  # fmt: skip
    print(f"baseline median (plain httpx client, same endpoint, {c} at a time): "
          f"{med(base_of_ceiling):.3f} of its ceiling; crawld/baseline median = "
          f"{med(versus):.3f}")  # fmt: skip
    print(f"the first round's pages without the json format (markdown only): "
          f"{plain_seconds:.2f} s = {n / plain_seconds:.1f} pages/s")  # fmt: skip
    cached_seconds, cached, cached_calls = cached_pass
    print(f"crawld again on the first round's pages (answer cache): {cached['pages']} pages "
          f"({cached['with_json']} with json) in {cached_seconds:.2f} s = "
          f"{n / cached_seconds:.1f} pages/s; model calls {cached_calls}")  # fmt: skip
    print(f"tokens counted: {usage['tokensUsed']} ({json.dumps(usage['providers'])})")
    ok = (med(of_observed) >= 0.9 and cached_calls == 0 and cached["with_json"] == n
          and all(stats["max_in_flight"] <= c and summary["with_json"] == n
                  for _, summary, stats in crawld))  # fmt: skip
    print("RESULT:", "ok" if ok else "BELOW GOAL")


if __name__ == "__main__":
    main()
