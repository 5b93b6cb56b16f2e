"""Functions the content-worker tests (test_pool.py) run in a worker: importable by name, and
importing nothing heavy, since each new worker imports this module."""

from __future__ import annotations

import os
import signal


def wait_on(fifo: str) -> str:
    """Block until the test writes a line to `fifo`, and return it."""
    with open(fifo) as f:
        return f.readline().strip()


def die() -> None:
    """End the process as a crash would."""
    os.kill(os.getpid(), signal.SIGKILL)


def fail() -> None:
    raise ValueError("bad page")


def pid() -> int:
    return os.getpid()


def policy() -> int:
    return os.sched_getscheduler(0)


class Odd(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")


def odd() -> None:
    """Raise an exception that pickles but does not unpickle (its args are not its __init__'s)."""
    raise Odd("CODE", "what went wrong")
