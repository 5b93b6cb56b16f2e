# `crawld demo`: the daemon plus the bundled simulators in one process, so a new user sees rows,
# jobs and webhooks move within a minute, with no accounts. The Octoparse simulator serves a task
# that keeps growing, a webhook receiver prints the events it gets, and the daemon collects with
# the embedded queue (or RabbitMQ when one answers and --broker amqp is given). The Bilibili
# simulator publishes videos into its newlist over time (one song close to 100k views), so the
# tracker discovers, classifies and snapshots them right away. A generated web site and an
# OpenAI-compatible model simulator serve the crawl API's json and summary formats ([llm]); the
# site's offer page changes its price every 90 s under a monitor that checks it every minute, so
# the console's Monitors page has checks and diffs to show. The demo's config is written to a
# file in the state directory, so `kill -HUP` reloads it like the real thing.
# With $CRAWLD_API_KEY set, the demo's API asks for that key and the printed commands send it.
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

from daemon import settings
from daemon.fakes import bilibili
from daemon.fakes.octoparse import DEMO_PASSWORD, OctoparseSim, serve_sim
from daemon.fakes.openai_compat import OpenAICompatService, serve_openai_compat
from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.site import SiteSim, serve_site
from daemon.logs import get_logger, setup_logging

log = get_logger("demo")
DAY_MS = 86_400_000
KEY_ENV = "CRAWLD_API_KEY"
"""When set, the demo's API needs this key (as `crawld status` expects; /metrics stays open)."""
MONITOR_NAME = "demo offer"
REPRICE_S = 90.0
"""How often the offer page's price changes (the demo monitor checks it every minute)."""

CONFIG = """\
# Written by `crawld demo`. Edit it and send SIGHUP (kill -HUP {pid}) to see a reload.
[daemon]
state_dir = "{state}"
log_level = "info"

[http]
bind = "{http}"
{api_key}
[broker]
kind = "{broker}"
url = "{amqp_url}"
password_env = "CRAWLD_DEMO_AMQP_PASSWORD"
queue = "crawld_demo"

[collector]
auto_start = true
interval = "{interval}"
batch_size = 100

[[collector.accounts]]
name = "demo"
base_url = "{octoparse}"
username = "demo"
password_env = "CRAWLD_DEMO_OCTOPARSE_PASSWORD"

[[collector.tasks]]
id = "demo"
account = "demo"
task_id = "{task_id}"
date_field = "发布时间"
webhook = "{receiver}/hooks/crawld"

[webhooks]
allow_cidrs = ["127.0.0.0/8"]
retry_schedule = ["1s", "5s", "30s"]

[tracker]
enabled = true
base_url = "{bilibili}"
discovery_interval = "20s"

[crawl]
allow_cidrs = ["127.0.0.0/8"]     # the demo's web site runs on this machine

[monitors]
min_interval = "1m"               # the demo's monitor checks the offer page every minute

[llm]                              # the model simulator (real ones: docs/how-to/llm-formats.md)
base_url = "{llm}/v1"
model = "crawld-sim-1"
max_concurrency = 4
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crawld demo", description=__doc__)
    parser.add_argument("--http", default="127.0.0.1:8700", help="crawld API address")
    parser.add_argument("--octoparse", default="127.0.0.1:8701", help="simulator address")
    parser.add_argument("--receiver", default="127.0.0.1:8702", help="webhook receiver address")
    parser.add_argument("--bilibili", default="127.0.0.1:8703", help="Bilibili simulator address")
    parser.add_argument(
        "--publish-every", type=float, default=15.0, help="seconds between new Bilibili videos"
    )
    parser.add_argument("--site", default="127.0.0.1:8704", help="generated web site address")
    parser.add_argument("--llm", default="127.0.0.1:8706", help="model simulator address")
    parser.add_argument("--broker", choices=["embedded", "amqp"], default="embedded")
    parser.add_argument("--amqp-url", default="amqp://guest@127.0.0.1:5672/")
    parser.add_argument("--rows", type=int, default=3000, help="rows the demo task starts with")
    parser.add_argument("--days", type=float, default=14.0, help="the rows span this many days")
    parser.add_argument("--grow", type=int, default=25, help="new rows every --grow-every")
    parser.add_argument("--grow-every", type=float, default=10.0, help="seconds")
    parser.add_argument("--interval", default="20s", help="time between collection runs")
    parser.add_argument("--state-dir", default=None, help="default: a new temporary directory")
    return parser


async def _grow(sim: OctoparseSim, task_id: str, count: int, every: float) -> None:
    while count > 0:
        await trio.sleep(every)
        sim.append_rows(task_id, count)


def _offer(price: int) -> tuple[bytes, str]:
    html = (f"<html><head><title>Offer</title></head><body><h1>Today's offer</h1>"
            f"<p>Price: {price} EUR</p><p>Delivery in 3 days.</p></body></html>")  # fmt: skip
    return html.encode(), "text/html"


async def _reprice(site: SiteSim, every: float) -> None:
    price = 10
    while True:
        site.files["/offer"] = _offer(price)
        await trio.sleep(every)
        price += 1


async def _add_monitor(api: str, key: str | None, site: SiteSim) -> None:
    """Once the API answers: the demo's monitor over the offer page and a tree page (unless one
    of that name exists, from an earlier run on the same --state-dir), and a first check."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    urls = [site.url("/offer", host="127.0.0.1"), site.url("/pages/1", host="127.0.0.1")]
    body = {"name": MONITOR_NAME, "schedule": {"cron": "* * * * *"},
            "targets": [{"type": "scrape", "urls": urls}]}  # fmt: skip
    async with httpx.AsyncClient(base_url=api, headers=headers, trust_env=False) as http:
        with trio.move_on_after(60) as waited:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/v2/monitor")).status_code == 200:
                        break
                await trio.sleep(0.5)
        if waited.cancelled_caught:
            log.warning("demo monitor not created: /v2/monitor did not answer")
            return
        listed = (await http.get("/v2/monitor")).json()["data"]
        if any(m["name"] == MONITOR_NAME for m in listed):
            return
        created = await http.post("/v2/monitor", json=body)
        if created.status_code != 200:
            log.warning("demo monitor not created", answer=created.text[:300])
            return
        await http.post(f"/v2/monitor/{created.json()['data']['id']}/run", json={})


def _bilibili_sim(publish_every_s: float) -> bilibili.BilibiliSim:
    """A zone with some history, a song about to pass 100k views, and new videos over time."""
    sim = bilibili.BilibiliSim(seed=int(time.time()), latency_ms=(20, 80))
    now = sim.clock()
    for i in range(12):
        sim.add_video(published_ms=now - (12 - i) * 600_000, song=i % 2 == 0)
    sim.add_video(
        title="【洛天依原创】十万星河",
        tags=["洛天依", "VOCALOID中文曲", "原创"],
        published_ms=now - 3_600_000,
        curve=bilibili.Curve.linear(6000, start=92_000),  # 100k about 20 minutes from now
    )
    sim.stream(int(publish_every_s * 1000), song_share=0.5)
    return sim


def _state_dir(given: str | None) -> Path:
    state = Path(given or tempfile.mkdtemp(prefix="crawld-demo-")).resolve()
    state.mkdir(parents=True, exist_ok=True)
    return state


async def run_demo(args: argparse.Namespace) -> int:
    from daemon.app import run_daemon

    state = await trio.to_thread.run_sync(_state_dir, args.state_dir)
    keyed = bool(os.environ.get(KEY_ENV, "").strip())
    os.environ.setdefault("CRAWLD_DEMO_OCTOPARSE_PASSWORD", DEMO_PASSWORD)
    os.environ.setdefault("CRAWLD_DEMO_AMQP_PASSWORD", "guest")
    sim = OctoparseSim()
    task_id = sim.add_task("demo", rows=args.rows, days=args.days)
    receiver = WebhookReceiver(bind=args.receiver)
    bili = _bilibili_sim(args.publish_every)
    site = SiteSim(pages=50)
    model = OpenAICompatService(latency=(0.2, 0.5))
    async with trio.open_nursery() as nursery:
        sim_host, sim_port = await nursery.start(
            lambda task_status: serve_sim(sim, args.octoparse, task_status=task_status)
        )
        rx_host, rx_port = await nursery.start(receiver.run)
        bili_host, bili_port = await nursery.start(
            lambda task_status: bilibili.serve_sim(bili, args.bilibili, task_status=task_status)
        )
        await nursery.start(
            lambda task_status: serve_site(site, args.site, task_status=task_status)
        )
        llm_host, llm_port = await nursery.start(
            lambda task_status: serve_openai_compat(model, args.llm, task_status=task_status)
        )
        path = state / "crawld-demo.toml"
        text = CONFIG.format(
            pid=os.getpid(),
            api_key=f'api_key_env = "{KEY_ENV}"\nmetrics_public = true\n' if keyed else "",
            state=state,
            http=args.http,
            broker=args.broker,
            amqp_url=args.amqp_url,
            interval=args.interval,
            octoparse=f"http://{sim_host}:{sim_port}",
            task_id=task_id,
            receiver=f"http://{rx_host}:{rx_port}",
            bilibili=f"http://{bili_host}:{bili_port}",
            llm=f"http://{llm_host}:{llm_port}",
        )
        await trio.Path(path).write_text(text, encoding="utf-8")
        cfg = settings.load(path)
        _print_banner(
            args, state, path, keyed, site,
            sim=f"{sim_host}:{sim_port}", rx=f"{rx_host}:{rx_port}",
            bili=f"{bili_host}:{bili_port}", llm=f"{llm_host}:{llm_port}",
        )  # fmt: skip
        nursery.start_soon(_grow, sim, task_id, args.grow, args.grow_every)
        nursery.start_soon(_reprice, site, REPRICE_S)
        key = os.environ.get(KEY_ENV, "").strip() or None
        nursery.start_soon(_add_monitor, f"http://{args.http}", key, site)
        started = time.monotonic()
        code = await run_daemon(cfg)
        log.info("demo finished", seconds=round(time.monotonic() - started, 1))
        receiver.stop()
        nursery.cancel_scope.cancel()
    return code


def _print_banner(
    args: argparse.Namespace, state: Path, path: Path, keyed: bool, site: SiteSim, *,
    sim: str, rx: str, bili: str, llm: str,
) -> None:  # fmt: skip
    """Where each simulator listens and what to try, on stderr."""
    api = f"http://{args.http}"
    auth = f' -H "Authorization: Bearer ${KEY_ENV}"' if keyed else ""
    json_type = " -H 'Content-Type: application/json'"
    print(
        f"""
crawld demo (pid {os.getpid()}), state in {state}
  Octoparse simulator  http://{sim}   (GET /_sim/stats)
                   task "demo": {args.rows} rows over {args.days:g} days,
                   +{args.grow} rows every {args.grow_every:g}s
  webhook receiver     http://{rx}   (GET /_receiver/summary)
  Bilibili simulator   http://{bili}   (GET /_sim/stats)
                   a new video every {args.publish_every:g}s, one song nearing 100k views
  web site             {site.url("/", host="127.0.0.1")}   (50 generated pages)
  model simulator      http://{llm}/v1   (OpenAI-compatible; GET /_sim/stats)
  crawld API           {api}   config {path}

Try, in another terminal:
  curl -s{auth} {api}/status | python3 -m json.tool     # what every part is doing
  curl -s{auth} {api}/queue/size                 # rows waiting in the {args.broker} queue
  curl -s{auth} -XPOST '{api}/consume?count=2' | python3 -m json.tool   # takes them off
  curl -s{auth}{json_type} {api}/crawl/start -d '{{"task_id": "demo"}}'   # 409 while running
  curl -s http://{rx}/_receiver/summary             # webhook events received
  curl -s {api}/metrics | grep crawld_
  curl -s{auth} {api}/status | python3 -c 'import json,sys; print(json.load(sys.stdin)["tracker"])'
  curl -s{auth} {api}/tracker/milestones | python3 -m json.tool   # songs nearest a milestone
  curl -s{auth} {api}/tracker/schedules | python3 -m json.tool    # schedules by type and status
  curl -s{auth}{json_type} {api}/v2/scrape -d '{{"url": "{site.url("/pages/3", host="127.0.0.1")}",
"formats": ["summary", {{"type": "json", "schema": {{"type": "object",
"properties": {{"title": {{"type": "string"}}}}}}}}]}}' | python3 -m json.tool   # LLM formats
  curl -s{auth} {api}/v2/team/token-usage | python3 -m json.tool   # tokens the model counted
  curl -s{auth} {api}/v2/monitor | python3 -m json.tool   # "{MONITOR_NAME}": checks every minute
Console: {api}/ui  (Monitors: the offer page's price changes every {REPRICE_S:g}s)
Stop with Ctrl-C.
""",
        file=sys.stderr,
        flush=True,
    )


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    setup_logging("info")
    return trio.run(run_demo, args)
