# /status has to explain the process exactly when something is wrong, and what is most often
# wrong is the store: while the database is cut, a section that reads it waits for a connection
# (the pool's timeout, 10 s) in a worker thread that cannot be cancelled, and the sections were
# read one after the other. So each section is read in a task of its own, outside the request
# (a trio system task), and the request waits for all of them together for at most WAIT_S; a
# section still reading then shows why it is missing instead of holding the whole document. A
# section's read still in flight is joined by the next request rather than started again, so a
# client polling /status during a cut adds no reads behind the stuck ones.
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from daemon.logs import get_logger
from daemon.redact import redact_text
from daemon.supervise import describe

WAIT_S = 2.0
"""How long /status waits for its sections, all together."""

log = get_logger("http")

Section = Callable[[], Awaitable[dict[str, Any]]]


class _Read:
    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: dict[str, Any] | None = None
        self.error: str | None = None


_IN_FLIGHT: dict[Section, _Read] = {}
"""Each section's read still going on, by the section's function (one per daemon and section)."""


async def read_all(
    sections: dict[str, Section], wait_s: float = WAIT_S
) -> dict[str, dict[str, Any]]:
    """Every section's answer, in the order given; a section that did not answer within
    `wait_s` (all sections together), or failed, reads `{"unavailable": why}`."""
    reads = {name: _start(name, fn) for name, fn in sections.items()}
    with trio.move_on_after(wait_s):
        for read in reads.values():
            await read.done.wait()
    return {name: _answer(read, wait_s) for name, read in reads.items()}


def _start(name: str, fn: Section) -> _Read:
    read = _IN_FLIGHT.get(fn)
    if read is None:
        read = _IN_FLIGHT[fn] = _Read()
        trio.lowlevel.spawn_system_task(_run, name, fn, read, name=f"status:{name}")
    return read


async def _run(name: str, fn: Section, read: _Read) -> None:
    try:
        read.result = await fn()
    except Exception as exc:  # a section's failure must not end the process
        read.error = redact_text(describe(exc))
        log.warning("a /status section failed", section=name, error=read.error)
    finally:
        read.done.set()
        if _IN_FLIGHT.get(fn) is read:
            del _IN_FLIGHT[fn]


def _answer(read: _Read, wait_s: float) -> dict[str, Any]:
    if read.result is not None:
        return read.result
    if read.error is not None:
        return {"unavailable": f"this section failed: {read.error}"}
    return {
        "unavailable": f"no answer within {wait_s:g} s: its read is still going on (most often"
        " the store not answering: see `store`)"
    }
