# Wake-ups: a task waiting for work another task (or another cluster member) makes — a drainer
# for new items, a producer for room, a lease holder for requests, an idle crawl worker for new
# links — waits on an event instead of polling the database.
#
# Why this shape (River's notifier, in one small module):
# - A write says what it made inside its own transaction: `notify(conn, channel, key)`. The
#   wake-up goes out only if that transaction commits (a rolled-back one, or a job of a group
#   that failed, wakes nobody): in this process the store fires the events once the group
#   committed; on PostgreSQL the same call also runs `pg_notify`, which the server delivers on
#   commit, to every process LISTENing on the schema's one channel (daemon/store/pglisten.py).
# - A waiter takes `wakeups.event(channel, key)` BEFORE it looks for work, then waits on it:
#   a wake-up between the look and the wait is never missed. A fired event is replaced by a
#   fresh one, so waiting again waits for the next wake-up.
# - Wake-ups are hints, never data: a spurious one costs a look, a lost one (the LISTEN
#   connection was down) costs at most `safety_s`, the slow poll every wait keeps as a safety
#   net. When the LISTEN connection is lost or comes back, every event fires: what was sent
#   meanwhile is gone, so everybody looks once.
# - Few channels (names below) and small payloads: a key is a stream, lease or job name; one
#   that would not fit PostgreSQL's 8000-byte payload wakes its whole channel instead.
from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import trio

APPENDED = "appended"
"""Items were appended to an outbox stream (key: the stream)."""
ACKED = "acked"
"""An outbox stream's cursor moved: room for a producer held back by its backlog (key: stream)."""
REQUEST = "request"
"""A request was left for a lease's holder (key: the lease)."""
RELEASED = "released"
"""A lease was given back: free for anybody now (key: "")."""
CRAWLS = "crawls"
"""A crawl or batch job was created (key: "")."""
FRONTIER = "frontier"
"""A crawl has URLs to claim (links queued, claims given back) or its end was decided (key: the
job)."""

PROBE = "probe"
"""Never sent: fired with every other event when the LISTEN connection is lost or back (the
store's probe then checks the writer's connection at once)."""

CHANNELS = (APPENDED, ACKED, REQUEST, RELEASED, CRAWLS, FRONTIER)
MAX_KEY_BYTES = 1000
"""A longer key wakes the whole channel (PostgreSQL's payload limit is 8000 bytes)."""

SAFETY_S = 5.0
"""How long a waiter waits at most when other processes may write what it waits for: the safety
net for a wake-up lost (LISTEN connection down, a pooler that drops it)."""

Note = tuple[str, str]


class Wakeups:
    """The trio events of one store, by (channel, key) (see the module comment).

    `safety_s`: None when only this process writes the store (SQLite): every wake-up is local
    and none can be lost."""

    def __init__(self, safety_s: float | None = None) -> None:
        self.safety_s = safety_s
        self.listening = False
        """Whether the LISTEN connection is up (PostgreSQL; always False on SQLite)."""
        self.counters = {"received": 0, "reconnects": 0}
        """Notifications received from other processes; times the LISTEN connection came back."""
        self._was_up = False
        self._events: weakref.WeakValueDictionary[Note, trio.Event] = weakref.WeakValueDictionary()

    def event(self, channel: str, key: str = "") -> trio.Event:
        """The event the next wake-up of (channel, key) sets: take it before looking for work."""
        note = (channel, key)
        event = self._events.get(note)
        if event is None:
            event = self._events[note] = trio.Event()
        return event

    def fire(self, channel: str, key: str = "") -> None:
        """Wake the waiters of (channel, key) (trio thread)."""
        event = self._events.pop((channel, key), None)
        if event is not None:
            event.set()

    def fire_channel(self, channel: str) -> None:
        """Wake every waiter of `channel`, whatever its key."""
        for note in [n for n in list(self._events) if n[0] == channel]:
            self.fire(*note)

    def fire_all(self) -> None:
        """Wake every waiter (wake-ups may have been lost: everybody looks once)."""
        events = list(self._events.values())
        self._events = weakref.WeakValueDictionary()
        for event in events:
            event.set()

    def received(self, payload: str) -> None:
        """A notification from another process (`payload` as `encode` made it)."""
        self.counters["received"] += 1
        channel, sep, key = payload.partition("\t")
        if sep:
            self.fire(channel, key)
        else:
            self.fire_channel(channel)

    def set_listening(self, up: bool) -> None:
        """The LISTEN connection came up or went down: fire everything (see the module
        comment)."""
        if up and not self.listening:
            if self._was_up:
                self.counters["reconnects"] += 1
            self._was_up = True
        self.listening = up
        self.fire_all()

    async def wait(self, *events: trio.Event) -> None:
        """Wait until one of `events` is set, or at most `safety_s` (None: no limit)."""
        limit = self.safety_s
        with trio.move_on_after(limit if limit is not None else float("inf")):
            await wait_any(*events)


async def wait_any(*events: trio.Event) -> None:
    """Return once one of `events` is set."""
    if len(events) == 1:
        await events[0].wait()
        return
    if any(event.is_set() for event in events):
        await trio.lowlevel.checkpoint()
        return
    await first(*(event.wait for event in events))


async def rescan(
    wakeups: Wakeups,
    channel: str,
    every_s: float,
    scan: Callable[[], Awaitable[object]],
    errors: tuple[type[BaseException], ...],
    woken: trio.Event,
) -> None:
    """Forever: run `scan` each time `channel` fires (in any process) and at least every
    `every_s`. `woken`: the channel's event, taken before the caller's own first scan, so a fire
    during that scan is not missed. A scan's `errors` are dropped: the next one tries again."""
    while True:
        with trio.move_on_after(every_s):
            await woken.wait()
        woken = wakeups.event(channel)
        with contextlib.suppress(*errors):
            await scan()


async def first(*waits: Callable[[], Awaitable[object]]) -> None:
    """Run every `wait()` until the first of them returns."""
    async with trio.open_nursery() as nursery:
        for wait in waits:

            async def one(w: Callable[[], Awaitable[object]] = wait) -> None:
                await w()
                nursery.cancel_scope.cancel()

            nursery.start_soon(one)


def encode(channel: str, key: str) -> str:
    """The notification payload of (channel, key): a key too long wakes the whole channel."""
    if len(key.encode()) > MAX_KEY_BYTES:
        return channel
    return f"{channel}\t{key}"


# The writer thread's current job: `notify` records there what to fire after the commit, and
# sends it to other processes through the backend's hook.


class _Current(threading.local):
    job: Any = None
    """What the store runs now: `notify` adds to its `notes` (a set, made on first use)."""
    send: Callable[[Any, str], None] | None = None


_current = _Current()


def begin(job: Any, send: Callable[[Any, str], None] | None) -> None:
    """The store is about to run write job `job` in this thread (its `notes` emptied)."""
    job.notes = None
    _current.job = job
    _current.send = send


def end() -> None:
    _current.job = None


def notify(conn: Any, channel: str, key: str = "") -> None:
    """Inside a store write: wake the waiters of (channel, key) in every process sharing the
    store once this transaction commits (see the module comment). Outside a store write (a
    migration, a copy, a test's bare connection) it does nothing: nobody waits there."""
    job = _current.job
    if job is None:
        return
    notes = job.notes
    if notes is None:
        notes = job.notes = set()
    elif (channel, key) in notes:
        return
    notes.add((channel, key))
    if _current.send is not None:
        _current.send(conn, encode(channel, key))
