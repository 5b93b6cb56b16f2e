# Wires the tracker (seed 002) into the daemon. Not built yet: `[tracker] enabled` has no effect.
from __future__ import annotations

from daemon.runtime import Daemon


def install(daemon: Daemon) -> None:
    return None
