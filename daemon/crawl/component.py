# Wires the Firecrawl-compatible crawl API into the daemon. Not built yet.
from __future__ import annotations

from daemon.runtime import Daemon


def install(daemon: Daemon) -> None:
    return None
