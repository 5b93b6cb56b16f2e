"""crawld plus DUTIES leases (`test:duty-0` …) that every instance wants and holds until it is
stopped or loses them, so a process test sees leases move without any area taking one.

    python -m tests.cluster.lease_daemon DUTIES --config CONFIG
"""

from __future__ import annotations

import functools
import sys

import trio

from daemon import settings as config
from daemon.app import Daemon, default_installers, run_daemon
from daemon.cluster import Lease
from daemon.logs import setup_logging
from daemon.store.errors import StoreUnavailable


async def hold(lease: Lease) -> None:
    await trio.sleep_forever()


def main(argv: list[str]) -> int:
    duties, _, config_path = argv
    cfg = config.load(config_path)
    setup_logging(cfg.daemon.log_level)

    def install_duties(daemon: Daemon) -> None:
        async def run(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
            cluster = daemon.cluster
            assert cluster is not None
            async with trio.open_nursery() as nursery:
                for i in range(int(duties)):
                    nursery.start_soon(cluster.run_owned, f"test:duty-{i}", hold)
                task_status.started()

        daemon.add_component("duties", run)

    try:
        return trio.run(
            functools.partial(run_daemon, cfg, installers=[*default_installers(), install_duties])
        )
    except StoreUnavailable as exc:
        print(f"cannot start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
