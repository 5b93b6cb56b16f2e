# Cluster mode: N crawld instances on one PostgreSQL store share the work, and the database is
# the only coordinator (no protocol between instances). Two tools, as in Firecrawl's NuQ, River
# and procrastinate:
# - a **lease** (`cluster_leases`, a row with a fencing token) for what must run in one place at
#   a time: a collector task, a stream's AMQP drainer, a job's webhook drainer, a paced crawl, a
#   singleton duty. `run_owned(name, fn)` waits for the lease, runs fn under it and cancels fn
#   the moment the lease is lost; every write fn makes on the strength of it calls
#   `lease.check(conn)` in the same transaction, so a process that was paused past its lease
#   and wakes up writes nothing stale.
# - a **claim** of rows by whoever is free (due tracker schedules, crawl frontier URLs), stamped
#   with this process's `claimant`; rows stamped by a claimant no longer in `LIVE_CLAIMANTS` were
#   left by a dead process and are claimed again (see each area's store).
#
# One task per process (`run`) does all the talking: each tick is one write holding the
# heartbeat, the renewal of every held lease and the tries for wanted free ones; a task that must
# know whether a lease it waits for is held elsewhere before it goes on (a collector task before
# the API serves) has the next tick come at once and waits for its try (`try_now`), rather than
# taking the lease beside the tick (a second take would fence out the first). A second task
# drops leases whose renewal has not come back in time (the database may be unreachable):
# River's "a leader that cannot renew steps down". With SQLite the same code runs with one member
# that takes every lease on its first try and never steps down (no one else can take over a file
# only it opens).
from __future__ import annotations

import contextlib
import functools
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from daemon import __version__
from daemon.cluster import rules
from daemon.cluster import store as cs
from daemon.cluster.rules import Offers
from daemon.logs import get_logger
from daemon.store import DB_ERRORS, Conn, Store, wake

__all__ = ["LIVE_CLAIMANTS", "Cluster", "Lease", "LeaseLost", "Offers", "Request"]

log = get_logger("cluster")
LIVE_CLAIMANTS = cs.LIVE_CLAIMANTS
FORGET_AFTER_MS = 7 * 24 * 3600 * 1000
"""A member row expired this long ago is dropped (an instance removed for good)."""


class LeaseLost(Exception):
    """A write made under a lease found another token in the lease row: another instance took
    it. Nothing of the transaction was kept."""

    def __init__(self, name: str) -> None:
        super().__init__(f"lease {name!r} is held by another instance now")
        self.name = name


class Request(msgspec.Struct, frozen=True):
    """A request another instance (or this one) left for the holder of a lease."""

    id: int
    action: str
    body: dict[str, Any]
    from_instance: str


@dataclass(eq=False)
class Lease:
    """A held lease. `scope` is cancelled and `lost` set the moment it is lost."""

    name: str
    token: int
    deadline: float
    """trio time until which the last renewal may be trusted."""
    lost: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    requests: trio.Event = field(default_factory=trio.Event)
    """Set when a request for this lease was left by this process (other processes' wake the
    holder through the store's wake-ups)."""

    def check(self, conn: Conn) -> None:
        """Inside a store transaction: raise LeaseLost unless the lease still has this token
        (and hold its row until the commit)."""
        if not cs.check(conn, self.name, self.token):
            raise LeaseLost(self.name)


def _release(conn: Conn, name: str, token: int) -> None:
    cs.release(conn, name, token)
    wake.notify(conn, wake.RELEASED)  # whoever waits for a free lease looks now


_json = msgspec.json.Encoder()
_body = msgspec.json.Decoder(dict[str, Any])


class Cluster:
    """This process's membership and leases (see the module comment)."""

    def __init__(
        self,
        store: Store,
        *,
        instance: str,
        lease_s: float,
        multi: bool,
        offers: Offers | None = None,
        address: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.store = store
        self.instance = instance
        self.claimant = f"{instance}/{secrets.token_hex(4)}"
        """Stamped on rows this process claims; new at every start."""
        self.lease_s = float(lease_s)
        self.lease_ms = int(lease_s * 1000)
        self.multi = multi
        """Whether other instances may share the store (PostgreSQL)."""
        self.offers = offers or Offers(lease_ms=self.lease_ms)
        self.address = address
        """Where this process's API listens (shown to the other members)."""
        self.held: dict[str, Lease] = {}
        self.joined = False
        self.healthy_ms: int | None = None
        """Database time of the last heartbeat that went through."""
        self._wanted: dict[str, trio.Event] = {}
        self._taken: dict[str, int] = {}
        self._wake = trio.Event()
        self._tries: dict[str, trio.Event] = {}
        """Lease name → set by the next tick that tries for it (what `try_now` waits for)."""
        self._next_renewal = 0.0
        self._retry_at: float | None = None
        """When the first lease wanted here and held elsewhere runs out (this clock)."""
        self.counters = {"taken": 0, "lost": 0, "released": 0}

    # Membership ---------------------------------------------------------------------------

    async def join(self) -> None:
        offers = _json.encode(self.offers).decode()

        def tx(conn: Conn) -> int:
            cs.forget_members(conn, FORGET_AFTER_MS)
            return cs.join(
                conn,
                instance=self.instance,
                claimant=self.claimant,
                host=socket.gethostname(),
                pid=os.getpid(),
                version=__version__,
                offers=offers,
                lease_ms=self.lease_ms,
            )

        self.healthy_ms = await self.store.write(tx)
        self.joined = True
        self._next_renewal = trio.current_time() + rules.renew_every_s(self.lease_s)
        log.info("joined the cluster", instance=self.instance, claimant=self.claimant)

    async def leave(self) -> None:
        """Free every lease and leave the member table (a clean stop)."""
        for lease in list(self.held.values()):
            self._drop(lease, lost=False)
        if self.joined:
            await self.store.write(lambda conn: cs.leave(conn, self.instance, self.claimant))
            self.joined = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Heartbeat, renew and take leases until cancelled; leaves the cluster on the way out."""
        try:
            await self.join()
            async with trio.open_nursery() as nursery:
                if self.multi:
                    # Alone on a SQLite file nobody can take a lease over: no stepping down.
                    nursery.start_soon(self._expire_loop)
                task_status.started()
                while True:
                    released = self.store.wakeups.event(wake.RELEASED)  # by any member
                    await self.tick()
                    sleep = rules.tick_in(
                        trio.current_time(),
                        self._next_renewal,
                        self._retry_at if self.multi else None,
                        rules.poll_every_s(self.lease_s),
                    )
                    with trio.move_on_after(sleep):
                        await wake.wait_any(self._wake, released)
                    self._wake = trio.Event()
        finally:
            with (
                trio.CancelScope(shield=True),
                trio.move_on_after(5),
                contextlib.suppress(*DB_ERRORS),
            ):
                await self.leave()

    async def tick(self) -> None:
        """One write: the heartbeat and renewals when due, and a try for each wanted lease."""
        now = trio.current_time()
        renewing = now >= self._next_renewal
        # A lease taken by the last tick whose waiter has not run yet is in `_taken`: trying it
        # again would take it a second time and fence out the very task about to hold it.
        wanted = [n for n in self._wanted if n not in self.held and n not in self._taken]
        if not wanted:
            self._retry_at = None
        if not renewing and not wanted:
            return
        held = [(lease.name, lease.token) for lease in self.held.values()]
        offers = _json.encode(self.offers).decode()
        http = self.address()

        def tx(conn: Conn) -> tuple[bool, list[str], dict[str, int], int | None, int]:
            alive: int | None = None  # the database's time of the heartbeat
            renewed = None
            if renewing:
                alive = cs.heartbeat(
                    conn, self.instance, self.claimant, self.lease_ms, http, offers
                )
                renewed = cs.renew(conn, held, self.lease_ms) if alive is not None else []
            taken = cs.acquire(conn, wanted, self.instance, self.lease_ms) if wanted else {}
            missed = [name for name in wanted if name not in taken]
            left = cs.expires_in(conn, missed) if missed else None
            return alive is not None, renewed or [], taken, left, alive or 0

        try:
            alive, renewed, taken, left_ms, db_now = await self.store.write(tx)
        except DB_ERRORS as exc:
            log.warning("cluster tick failed; leases are kept until they run out", error=str(exc))
            self._retry_at = trio.current_time() + rules.poll_every_s(self.lease_s)
            return
        # Held elsewhere: try again when the first one runs out (a release wakes us sooner).
        self._retry_at = None if left_ms is None else trio.current_time() + left_ms / 1000
        if renewing:
            self._next_renewal = now + rules.renew_every_s(self.lease_s)
            if not alive:
                log.warning("this instance's member row was gone: joining again")
                for lease in list(self.held.values()):
                    self._drop(lease, lost=True)
                await self.join()
            else:
                self.healthy_ms = db_now
                for name in rules.lost_leases((n for n, _ in held), renewed):
                    if (held_lease := self.held.get(name)) is not None:
                        self._drop(held_lease, lost=True)
                for name in renewed:
                    if (held_lease := self.held.get(name)) is not None:
                        held_lease.deadline = rules.local_deadline(now, self.lease_s)
        for name, token in taken.items():
            self._taken[name] = token
            if (event := self._wanted.get(name)) is not None:
                event.set()
        for name in wanted:
            if (tried := self._tries.pop(name, None)) is not None:
                tried.set()

    async def _expire_loop(self) -> None:
        while True:
            now = trio.current_time()
            for lease in list(self.held.values()):
                if lease.deadline <= now:
                    log.warning("lease not renewed in time: stepping down", lease=lease.name)
                    self._drop(lease, lost=True)
            deadlines = [lease.deadline for lease in self.held.values()]
            await trio.sleep_until(min(deadlines, default=now + rules.poll_every_s(self.lease_s)))

    # Leases -------------------------------------------------------------------------------

    async def acquire(self, name: str) -> Lease:
        """Wait until this process holds `name` (tried at once, then every tick)."""
        if name in self.held or name in self._wanted:
            raise RuntimeError(f"lease {name!r} is already held or awaited by this process")
        event = self._wanted[name] = trio.Event()
        try:
            self._wake.set()
            while True:
                await event.wait()
                token = self._taken.pop(name, None)
                if token is not None:
                    return self._hold(name, token)
                event = self._wanted[name] = trio.Event()
        finally:
            self._wanted.pop(name, None)
            if (token := self._taken.pop(name, None)) is not None:
                # Taken but nobody is left to run it: give it straight back.
                with trio.CancelScope(shield=True), contextlib.suppress(*DB_ERRORS):
                    await self.store.write(functools.partial(_release, name=name, token=token))

    async def try_now(self, name: str) -> bool:
        """Have the cluster task try at once for `name`, which a task of this process waits for
        (or is about to wait for) in `acquire`, and wait for that try: whether this process
        holds the lease then, or has just taken it for its waiter (False: held elsewhere)."""
        if name not in self.held and name not in self._taken:
            tried = self._tries.setdefault(name, trio.Event())
            self._wake.set()
            await tried.wait()
        return name in self.held or name in self._taken

    async def try_acquire(self, names: Sequence[str]) -> list[Lease]:
        """Take those of `names` that are free now, in one write; held ones are skipped."""
        names = [n for n in names if n not in self.held and n not in self._wanted]
        if not names:
            return []
        taken = await self.store.write(
            lambda conn: cs.acquire(conn, names, self.instance, self.lease_ms)
        )
        return [self._hold(name, token) for name, token in taken.items()]

    def _hold(self, name: str, token: int) -> Lease:
        lease = Lease(name, token, rules.local_deadline(trio.current_time(), self.lease_s))
        self.held[name] = lease
        self.counters["taken"] += 1
        log.info("lease taken", lease=name, token=token)
        return lease

    def _drop(self, lease: Lease, *, lost: bool) -> None:
        if self.held.get(lease.name) is lease:
            del self.held[lease.name]
        if lost and not lease.lost.is_set():
            self.counters["lost"] += 1
            log.warning("lease lost", lease=lease.name, token=lease.token)
            lease.lost.set()
        lease.scope.cancel()

    async def release(self, lease: Lease) -> None:
        """Give a held lease back so another instance may take it at once."""
        if self.held.get(lease.name) is not lease:
            return
        self._drop(lease, lost=False)
        self.counters["released"] += 1
        with trio.CancelScope(shield=True), contextlib.suppress(*DB_ERRORS):
            await self.store.write(functools.partial(_release, name=lease.name, token=lease.token))

    async def run_owned(
        self, name: str, fn: Callable[[Lease], Awaitable[None]], *, again: bool = True
    ) -> None:
        """Run `fn(lease)` whenever this process holds `name`: wait for the lease, run fn until
        it returns (then release) or the lease is lost (fn is cancelled; with `again`, wait for
        the lease once more). Another exception of fn releases the lease and propagates."""
        while True:
            lease = await self.acquire(name)
            try:
                with lease.scope:
                    try:
                        await fn(lease)
                    except* LeaseLost:
                        self._drop(lease, lost=True)
            finally:
                if not lease.lost.is_set():
                    await self.release(lease)
            if not (lease.lost.is_set() and again):
                return
            log.info("waiting to take the lease again", lease=name)

    # Requests to a lease's holder --------------------------------------------------------

    async def request(self, lease: str, action: str, body: dict[str, Any]) -> int:
        """Leave a request for whoever holds `lease` (or takes it next)."""
        raw = _json.encode(body).decode()

        def tx(conn: Conn) -> int:
            wake.notify(conn, wake.REQUEST, lease)
            return cs.post_request(conn, lease, action, raw, self.instance)

        rid = await self.store.write(tx)
        if (held := self.held.get(lease)) is not None:
            held.requests.set()
        return int(rid)

    async def requests(self, lease: Lease) -> list[Request]:
        """Wait for requests left for `lease` (those left before it was taken are found at
        once), and take them. Woken by the request's commit, in whichever process made it; a
        read every `safety_s` in case a wake-up was lost."""
        wakeups = self.store.wakeups
        while True:
            woken = wakeups.event(wake.REQUEST, lease.name)
            if lease.requests.is_set():
                lease.requests = trio.Event()
            local = lease.requests
            if await self.store.read(lambda conn: cs.has_requests(conn, lease.name)):
                rows = await self.store.write(
                    lambda conn: cs.take_requests(conn, lease.name, lease.token)
                )
                if rows:
                    return [
                        Request(rid, action, _body.decode(body), frm)
                        for rid, action, body, frm in rows
                    ]
            await wakeups.wait(woken, local)

    async def holder(self, lease: str) -> str | None:
        """The instance holding `lease` now (None: free)."""
        if lease in self.held:
            return self.instance
        return await self.store.read(lambda conn: cs.holder(conn, lease))

    # What /status shows -------------------------------------------------------------------

    async def view(self) -> dict[str, Any]:
        def read(conn: Conn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            return cs.members(conn), cs.leases(conn)

        members, leases = await self.store.read(read)
        holds: dict[str, list[str]] = {}
        for row in leases:
            if row["held"]:
                holds.setdefault(row["holder"], []).append(row["name"])
        others: list[tuple[str, Offers]] = []
        shown = []
        for m in members:
            is_alive = rules.alive(m["expires_ms"], m["now_ms"])
            if is_alive:
                with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                    others.append((m["instance"], msgspec.json.decode(m["offers"], type=Offers)))
            shown.append(
                {
                    "instance": m["instance"],
                    "host": m["host"],
                    "pid": m["pid"],
                    "http": m["http"],
                    "version": m["version"],
                    "started_ms": m["started_ms"],
                    "heartbeat_ms": m["heartbeat_ms"],
                    "expires_ms": m["expires_ms"],
                    "alive": is_alive,
                    "self": m["claimant"] == self.claimant,
                    "holds": sorted(holds.get(m["instance"], [])) if is_alive else [],
                }
            )
        return {
            "enabled": self.multi,
            "instance": self.instance,
            "claimant": self.claimant,
            "lease_s": self.lease_s,
            "members": shown,
            "leases_held": sorted(self.held),
            "disagreements": rules.disagreements(self.offers, self.instance, others),
            "counters": dict(self.counters),
            "wakeups": {
                "listening": self.store.wakeups.listening,
                "safety_poll_s": self.store.wakeups.safety_s,
                **self.store.wakeups.counters,
            },
        }
