"""The agent loop's own overhead: /v2/agent runs over the generated site and a simulated search
index, with the OpenAI-compatible simulator answering in 300-600 ms and the site's pages in
50-150 ms.

Processes: the generated site (`python -m daemon.fakes.site --latency 0.05,0.15`), a SearXNG
simulator whose results are pages of that site, the model simulator
(`python -m daemon.fakes.openai_compat --latency 0.3-0.6`) and a fresh `crawld run`. Each round
starts an agent without urls (so it searches, reads, chooses, reads again and answers) and polls
it every 10 ms. Figures, all from the same run:

- wall time: POST to the poll that saw it finished;
- its critical path, from the run's own trace (GET /v2/agent/{id}/steps, each step's `ms`): the
  search, every model call (one at a time) and, for each batch of pages read together, its
  slowest fetch. critical / wall is the share of the run spent waiting on work it had to do;
  goal >= 0.8 (the loop's own overhead — store commits, events, its decisions — small). The
  simulator's own count of busy seconds is printed next to the trace's model time;
- pages fetched per answer and tokens per answer.

Usage: .venv/bin/python scripts/bench_agent.py [--rounds 5]
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
from typing import Any

import httpx
from benchkit import free_port, wait_up

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = {"type": "object", "properties": {"title": {"type": "string"},
                                           "words": {"type": "integer"}}}  # fmt: skip

SEARXNG = textwrap.dedent(
    """
    import sys, trio
    from daemon.fakes.searxng import SearxngSim, serve_searxng
    site, bind = sys.argv[1], sys.argv[2]
    sim = SearxngSim(total=10)
    sim.result_url = lambda i: f"{site}/pages/{i * 7 + 3}"
    trio.run(serve_searxng, sim, bind)
    """
)


def spawn(*args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def config_text(port: int, sim: str, searxng: str) -> str:
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
        [search]
        base_url = "{searxng}"
        [llm]
        base_url = "{sim}/v1"
        model = "sim"
        cache_ttl = "0s"
        timeout = "30s"
        [agent]
        max_steps = 12
        pages_per_step = 3
        """)


def critical_path(steps: list[dict[str, Any]]) -> tuple[float, float]:
    """(seconds of the run's critical path, of which model calls): each step's work in order,
    a batch of consecutive page reads counting its slowest."""
    total = model = 0.0
    batch: list[float] = []
    for step in steps:
        if step["action"] == "scrape":
            batch.append(step["ms"] / 1000)
            continue
        total += max(batch, default=0.0)
        batch = []
        total += step["ms"] / 1000
        if step["action"] in ("choose", "answer"):
            model += step["ms"] / 1000
    return total + max(batch, default=0.0), model


def one_run(client: httpx.Client, sim: str, prompt: str) -> dict[str, Any]:
    httpx.post(sim + "/_sim/reset", trust_env=False)
    t0 = time.perf_counter()
    job = client.post("/v2/agent", json={"prompt": prompt, "schema": SCHEMA}).json()["id"]
    while (status := client.get(f"/v2/agent/{job}").json())["status"] == "processing":
        time.sleep(0.01)
    wall = time.perf_counter() - t0
    steps = client.get(f"/v2/agent/{job}/steps").json()["steps"]
    critical, model = critical_path(steps)
    stats = httpx.get(sim + "/_sim/stats", trust_env=False).json()
    return {
        "status": status["status"], "wall": wall, "critical": critical, "model": model,
        "sim_busy": stats["busy_seconds"], "calls": stats["requests"],
        "pages": sum(1 for s in steps if s["action"] == "scrape"),
        "tokens": sum(s["tokens"] for s in steps), "steps": len(steps),
        "credits": status["creditsUsed"],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    site_port, sim_port, search_port, port = free_port(), free_port(), free_port(), free_port()
    site, sim = f"http://127.0.0.1:{site_port}", f"http://127.0.0.1:{sim_port}"
    searxng = f"http://127.0.0.1:{search_port}"
    procs = [
        spawn("-m", "daemon.fakes.site", "--bind", f"127.0.0.1:{site_port}", "--pages", "400",
              "--latency", "0.05,0.15", "--paragraphs", "2"),
        spawn("-m", "daemon.fakes.openai_compat", "--bind", f"127.0.0.1:{sim_port}",
              "--latency", "0.3-0.6"),
        spawn("-c", SEARXNG, site, f"127.0.0.1:{search_port}"),
    ]  # fmt: skip
    tmp = tempfile.TemporaryDirectory(prefix="bench-agent-")
    runs: list[dict[str, Any]] = []
    try:
        wait_up(site + "/")
        wait_up(sim + "/_sim/stats")
        wait_up(searxng + "/search?q=x&format=json")
        config = Path(tmp.name) / "crawld.toml"
        config.write_text(config_text(port, sim, searxng))
        procs.append(spawn("-m", "daemon", "run", "--config", str(config)))
        wait_up(f"http://127.0.0.1:{port}/healthz")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False,
                          timeout=60) as client:  # fmt: skip
            for r in range(args.rounds):  # each round its own prompt: nothing from a cache
                runs.append(one_run(client, sim, f"Titles of the tree pages, round {r}"))
    finally:
        for proc in reversed(procs):
            stop(proc)
        tmp.cleanup()
    report(runs)


def report(runs: list[dict[str, Any]]) -> None:
    print("agent runs: search, reads (site 50-150 ms a page), model choices and answer "
          "(simulator 300-600 ms a call), [agent] max_steps = 12, pages_per_step = 3")  # fmt: skip
    for i, run in enumerate(runs, 1):
        print(
            f"run {i}: {run['status']} in {run['wall']:.2f} s, critical path "
            f"{run['critical']:.2f} s ({run['critical'] / run['wall']:.3f} of the wall time; "
            f"model {run['model']:.2f} s by the trace, {run['sim_busy']:.2f} s by the simulator, "
            f"{run['calls']} calls), {run['steps']} steps, {run['pages']} pages, "
            f"{run['tokens']} tokens, {run['credits']} credits"
        )
    med = statistics.median
    print(f"median critical path / wall time: {med(r['critical'] / r['wall'] for r in runs):.3f}"
          " (goal >= 0.8)")  # fmt: skip
    print(f"median pages fetched per answer: {med(r['pages'] for r in runs):.1f}; "
          f"tokens per answer: {med(r['tokens'] for r in runs):.0f}")  # fmt: skip
    print(json.dumps({"runs": runs}))


if __name__ == "__main__":
    main()
