"""crawld plus a producer, for the kill -9 tests: on its first start (no MARKER file yet) it
creates JOBS jobs (1 unless given) with a webhook to URL, issues COUNT page events for each
(taking turns) and finishes them; the MARKER file then holds "<job id> ... done". On later starts
it only resumes delivery.

    python -m tests.jobs.crash_daemon CONFIG URL COUNT MARKER [JOBS]
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


def main(argv: list[str]) -> int:
    config_path, url, count, marker_path, *more = argv
    jobs_wanted = int(more[0]) if more else 1
    marker = Path(marker_path)
    cfg = config.load(config_path)
    setup_logging("warning")
    first_start = not marker.exists()

    def install_producer(daemon: Daemon) -> None:
        async def produce(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            if not first_start:
                return
            jobs = daemon.jobs
            spec = WebhookSpec(url=url)
            ids = [
                await jobs.create_job("crawl", webhook=spec, source={}) for _ in range(jobs_wanted)
            ]
            for i in range(int(count)):
                for job in ids:
                    await jobs.page(job, [{"i": i}])
            for job in ids:
                await jobs.finish(job, "completed")
            scratch = marker.with_suffix(".tmp")
            scratch.write_text(" ".join(ids) + " done\n")
            os.replace(scratch, marker)

        daemon.add_component("producer", produce)

    run = functools.partial(run_daemon, cfg, installers=[*default_installers(), install_producer])
    return trio.run(run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
