"""crawld plus a paced producer, for the fault tests (database cuts, PostgreSQL restarts, kill -9):
on its first start (no ID file yet) it creates one job with a webhook to URL and writes its id to
ID at once, issues COUNT page events PACE seconds apart, waits for the file GATE (when given) and
then finishes the job; the ID file then reads "<job id> done". Later starts only run crawld (the
job's delivery resumes wherever its lease is).

    python -m tests.jobs.fault_daemon CONFIG URL COUNT PACE ID [GATE]
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import trio

from daemon import settings as config
from daemon.app import Daemon, default_installers, run_daemon
from daemon.config import WebhookSpec
from daemon.logs import setup_logging


def _write(path: Path, text: str) -> None:
    scratch = path.with_suffix(".tmp")
    scratch.write_text(text)
    os.replace(scratch, path)


def main(argv: list[str]) -> int:
    config_path, url, count, pace, id_path, *gate = argv
    id_file = Path(id_path)
    cfg = config.load(config_path)
    setup_logging("info")
    first_start = not id_file.exists()

    def install_producer(daemon: Daemon) -> None:
        async def produce(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            if (
                not first_start or await trio.Path(id_file).exists()
            ):  # a later start, or this component restarted
                return
            jobs = daemon.jobs
            job = await jobs.create_job("crawl", webhook=WebhookSpec(url=url), source={})
            _write(id_file, f"{job}\n")
            for i in range(int(count)):
                await jobs.page(job, [{"i": i}])
                await trio.sleep(float(pace))
            if gate:
                while not await trio.Path(gate[0]).exists():
                    await trio.sleep(0.05)
            await jobs.finish(job, "completed")
            _write(id_file, f"{job} done\n")

        daemon.add_component("producer", produce)

    run = functools.partial(run_daemon, cfg, installers=[*default_installers(), install_producer])
    return trio.run(run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
