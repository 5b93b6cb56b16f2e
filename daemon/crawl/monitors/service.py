# Monitors: definitions kept in the store, a scheduler that turns due monitors into checks, and
# one CheckRun (check.py) per open check. The scheduler is a thin loop around the pure rules of
# schedule.py: it looks for due monitors at the earliest next run (at most every [monitors] tick,
# and at once when a monitor changes), and claims each by a compare-and-set on its next run in
# the same transaction that creates the check (a `jobs` row of kind monitor, which carries the
# check's webhook events), so across a cluster one instance creates each check and a restart
# after downtime creates one catch-up check per monitor, not one per missed time. A due monitor
# whose previous check still runs gets a `skipped_overlap` check instead. A finished check's
# notifications are recorded with its end and sent by the Notifier (notifier.py).
from __future__ import annotations

import contextlib
import uuid
from typing import Any

import msgspec
import trio

from daemon.clock import EpochClock, wall_ms
from daemon.cluster import Cluster
from daemon.config import WebhookSpec
from daemon.crawl.extract.service import Llm
from daemon.crawl.monitors import models, schedule
from daemon.crawl.monitors import notify_store as nstore
from daemon.crawl.monitors import store as mstore
from daemon.crawl.monitors.check import CheckRun, monitor_checks
from daemon.crawl.monitors.config import MonitorConfig
from daemon.crawl.monitors.notifier import Notifier
from daemon.crawl.problems import BadRequest
from daemon.crawl.runs.runs import Runs
from daemon.crawl.runs.service import CrawlService
from daemon.crawl.search.service import SearchService
from daemon.jobs.store import JobFinished, JobNotFound
from daemon.logs import get_logger
from daemon.store import DB_ERRORS, Conn

log = get_logger("monitors")

SCAN_S = 5.0
"""How often open checks without a run here are looked for (a check's creation wakes every
instance's scan)."""


class MonitorNotFound(LookupError):
    pass


class RunRefused(Exception):
    """A manual run that cannot start: the monitor is paused, or `check_id` runs."""

    def __init__(self, reason: str, check_id: str | None = None) -> None:
        super().__init__(reason)
        self.check_id = check_id


class _Lost(Exception):
    """The claim lost its compare-and-set: the transaction rolls back."""


def _uuid(text: str) -> str | None:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


class MonitorService:
    """/v2/monitor's operations, the scheduler and the checks' runs."""

    def __init__(self, crawl: CrawlService, config: MonitorConfig,
                 search: SearchService | None = None, llm: Llm | None = None, *,
                 clock_ms: EpochClock = wall_ms) -> None:  # fmt: skip
        self.crawl = crawl
        self.search = search
        self.llm = llm
        self.judged = 0
        """Model calls made to judge changed pages since start (/status)."""
        self.config = config
        self.store = crawl.store
        self.jobs = crawl.jobs
        self.cluster: Cluster | None = crawl.cluster
        self.clock_ms = clock_ms
        self._runs: Runs[mstore.CheckRow, CheckRun] = Runs(
            "monitors", self.store, self.jobs, mstore.open_check_ids, mstore.get_check,
            lambda row: CheckRun(self, row),
        )  # fmt: skip
        self.runs = self._runs.by_id
        self._changed = trio.Event()
        self.checks_created = 0
        self.notifier = Notifier(self.store, config, clock_ms)

    def configure(self, config: MonitorConfig) -> None:
        self.notifier.configure(config)
        self.config = config
        self._changed.set()

    @property
    def min_interval_ms(self) -> int:
        return int(self.config.min_interval * 1000)

    def _validate(self, raw: dict[str, Any], monitor_id: str, *, update: bool = False
                  ) -> models.MonitorSpec:  # fmt: skip
        return models.validate(
            raw, monitor_id=monitor_id, min_interval_ms=self.min_interval_ms,
            now_ms=self.clock_ms(), browser=self.crawl.browser is not None,
            default_limit=self.config.crawl_limit, update=update,
            search=self.search is not None and self.search.enabled, llm=self.llm,
            smtp=self.config.smtp, notify_targets=self.config.target_names(),
        )  # fmt: skip

    def _next_run(self, spec: models.MonitorSpec, after_ms: int) -> tuple[int | None, int | None]:
        cron, tz = schedule.parse_cron(spec.cron), schedule.zone(spec.timezone)
        due = schedule.next_fire(cron, tz, after_ms)
        return due, None if due is None else due + spec.jitter_ms

    # -- definitions -----------------------------------------------------------------------

    async def create(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Validate and store a monitor (BadRequest naming the fields otherwise)."""
        monitor_id = str(uuid.uuid4())
        spec = self._validate(raw, monitor_id)
        at = self.clock_ms()
        due, next_run = self._next_run(spec, at)
        row = mstore.MonitorRow(monitor_id, spec.name, "active", models.encode(spec), due,
                                next_run, None, None, None, at, at)  # fmt: skip
        await self.store.write(lambda c: mstore.insert_monitor(c, row))
        self._changed.set()
        log.info("monitor created", monitor=monitor_id, cron=spec.cron, targets=len(spec.targets))
        return models.monitor_json(row, spec)

    async def get(self, monitor_id: str) -> dict[str, Any]:
        row = await self._row(monitor_id)
        return models.monitor_json(row, models.decode_spec(row.spec))

    async def _row(self, monitor_id: str) -> mstore.MonitorRow:
        key = _uuid(monitor_id)
        row = None if key is None else await self.store.read(lambda c: mstore.get_monitor(c, key))
        if row is None:
            raise MonitorNotFound(monitor_id)
        return row

    async def listing(self, limit: int, offset: int) -> list[dict[str, Any]]:
        rows = await self.store.read(lambda c: mstore.list_monitors(c, limit, offset))
        return [models.monitor_json(r, models.decode_spec(r.spec)) for r in rows]

    async def update(self, monitor_id: str, patch: dict[str, Any]) -> dict[str, Any]:
        row = await self._row(monitor_id)
        status = patch.get("status", row.status)
        if status not in ("active", "paused"):
            raise BadRequest.at("$.status", "one of active, paused")
        old = models.decode_spec(row.spec)
        spec = self._validate(models.merged(old, patch), row.id, update=True)
        if "schedule" not in patch:
            spec.jitter_ms = old.jitter_ms  # the stored cron of a text schedule keeps its delay
        at = self.clock_ms()
        due, next_run = row.due_ms, row.next_run_ms
        if "schedule" in patch or (status == "active" and row.status != "active"):
            due, next_run = self._next_run(spec, at)
        encoded = models.encode(spec)
        await self.store.write(lambda c: mstore.update_monitor(
            c, row.id, name=spec.name, status=status, spec=encoded, due_ms=due,
            next_run_ms=next_run, at_ms=at))  # fmt: skip
        self._changed.set()
        return await self.get(row.id)

    async def delete(self, monitor_id: str) -> None:
        """Delete the monitor, its checks and snapshots; its running check stops."""
        row = await self._row(monitor_id)
        await self.store.write(lambda c: mstore.delete_monitor(c, row.id))
        if row.current_check is not None:
            with contextlib.suppress(JobFinished, JobNotFound):
                await self.jobs.finish(row.current_check, "cancelled", "the monitor was deleted")

    # -- checks ----------------------------------------------------------------------------

    async def run_now(self, monitor_id: str) -> dict[str, Any]:
        """Start a manual check; RunRefused when paused or a check runs."""
        row = await self._row(monitor_id)
        if row.status != "active":
            raise RunRefused("Monitor is paused")
        if row.current_check is not None:
            raise RunRefused("A check of this monitor is already running", row.current_check)
        check_id = await self._create_check(row, "manual", self.clock_ms(), None)
        if check_id is None:
            fresh = await self._row(monitor_id)
            raise RunRefused("A check of this monitor is already running", fresh.current_check)
        started = await self.check(monitor_id, check_id, limit=0)
        for key in ("pages", "more"):
            started.pop(key)
        return started

    async def _create_check(self, row: mstore.MonitorRow, trigger: str, scheduled_ms: int | None,
                            claim: schedule.Due | None) -> str | None:  # fmt: skip
        """A check (and its job) for the monitor, if the claim (scheduled) or the monitor's
        free slot (manual) is still there; None otherwise."""
        spec = models.decode_spec(row.spec)
        webhook = None if spec.webhook is None else msgspec.convert(spec.webhook, WebhookSpec)
        at = self.clock_ms()
        made: list[mstore.CheckRow] = []

        def setup(conn: Conn, check_id: str) -> None:
            if claim is None:
                if not mstore.start_manual(conn, row.id, check_id, at):
                    raise _Lost
            else:
                next_run = None if claim.next_due_ms is None else claim.next_due_ms + spec.jitter_ms
                if not mstore.claim(conn, row.id, row.next_run_ms or 0, due_ms=claim.next_due_ms,
                                    next_run_ms=next_run, check_id=check_id, at_ms=at):  # fmt: skip
                    raise _Lost
            check = mstore.CheckRow(
                check_id, row.id, "queued", trigger, row.spec, False, scheduled_ms or at,
                None, None, None, None, None, at, at)  # fmt: skip
            mstore.insert_check(conn, check)
            made[:] = [check]

        try:
            check_id = await self.jobs.create_job(
                "monitor", webhook=webhook, source={"monitorId": row.id}, setup=setup
            )
        except _Lost:
            return None
        self.checks_created += 1
        self._runs.spawn(made[0])  # the row as committed: no read before the check starts
        return check_id

    async def checks(self, monitor_id: str, limit: int, offset: int, status: str | None
                     ) -> list[dict[str, Any]]:  # fmt: skip
        row = await self._row(monitor_id)

        def read(c: Conn) -> tuple[list[mstore.CheckRow], dict[str, dict[str, str]]]:
            found = mstore.list_checks(c, row.id, limit, offset, status)
            return found, nstore.states(c, [r.id for r in found])

        rows, notified = await self.store.read(read)
        return [models.check_json(r, notified.get(r.id)) for r in rows]

    async def check(self, monitor_id: str, check_id: str, skip: int = 0, limit: int = 100,
                    status: str | None = None) -> dict[str, Any]:  # fmt: skip
        """A check with its pages from `skip` (`more` set when pages follow)."""
        row = await self._row(monitor_id)
        key = _uuid(check_id)

        def read(c: Conn) -> tuple[mstore.CheckRow | None, list[mstore.PageRow], dict[str, str]]:
            found = None if key is None else mstore.get_check(c, key)
            if found is None or found.monitor_id != row.id:
                return None, [], {}
            pages = mstore.pages(c, found.id, skip, limit + 1, status)
            return found, pages, nstore.states(c, [found.id]).get(found.id, {})

        found, pages, notified = await self.store.read(read)
        if found is None:
            raise MonitorNotFound(check_id)
        body = models.check_json(found, notified)
        body["pages"] = [models.page_json(found.id, p) for p in pages[:limit]]
        body["more"] = len(pages) > limit
        return body

    async def page(self, monitor_id: str, check_id: str, n: int) -> dict[str, Any]:
        """Page `n` of a check (its id is `{checkId}:{n}`); MonitorNotFound when the monitor,
        the check or the page is unknown."""
        row = await self._row(monitor_id)
        key = _uuid(check_id)

        def read(c: Conn) -> tuple[mstore.CheckRow | None, mstore.PageRow | None]:
            found = None if key is None else mstore.get_check(c, key)
            if found is None or found.monitor_id != row.id:
                return None, None
            return found, mstore.page(c, found.id, n)

        found, page = await self.store.read(read)
        if found is None or page is None:
            raise MonitorNotFound(f"{check_id}:{n}")
        return models.page_json(found.id, page)

    # -- scheduler -------------------------------------------------------------------------

    async def tick(self, now_ms: int) -> int:
        """Claim the monitors due at `now_ms`, oldest due first, [monitors] claim_batch per
        look and looking again at once while a full batch came back, so a backlog of thousands
        drains in one tick: a check each, or a `skipped_overlap` one when its previous check
        still runs. A monitor that cannot be scheduled (logged) is passed over until the next
        tick. Returns the checks made."""
        made = 0
        failed: set[str] = set()
        while True:
            batch = self.config.claim_batch
            asked = batch + len(failed)
            rows = await self.store.read(
                lambda c: mstore.due_monitors(c, now_ms, asked)  # noqa: B023 - awaited here
            )
            made += await self._claim([r for r in rows if r.id not in failed][:batch], now_ms,
                                      failed)  # fmt: skip
            if len(rows) < asked:
                return made

    async def _claim(self, rows: list[mstore.MonitorRow], now_ms: int, failed: set[str]) -> int:
        """The rows' claims all at once, so the store commits them together (one claim after
        the other, each waiting for its own commit, fell behind 10 due monitors a second on
        PostgreSQL); the ids of those that cannot be scheduled go to `failed`; a store error
        is raised once every claim has ended."""
        made: list[int] = []
        store_errors: list[BaseException] = []

        async def one(row: mstore.MonitorRow) -> None:
            try:
                made.append(await self._due(row, now_ms))
            except DB_ERRORS as exc:
                store_errors.append(exc)
            except Exception as exc:  # one bad monitor must not stop the others' schedules
                log.error("monitor not scheduled", monitor=row.id, exc_info=exc)
                failed.add(row.id)

        async with trio.open_nursery() as nursery:
            for row in rows:
                nursery.start_soon(one, row)
        if store_errors:
            raise store_errors[0]
        return sum(made)

    async def _due(self, row: mstore.MonitorRow, now_ms: int) -> int:
        spec = models.decode_spec(row.spec)
        cron, tz = schedule.parse_cron(spec.cron), schedule.zone(spec.timezone)
        decision = schedule.on_due(cron, tz, row.due_ms or now_ms, now_ms,
                                   row.current_check is not None)  # fmt: skip
        if decision.overlap:
            return await self._skip(row, spec, decision, now_ms)
        made = await self._create_check(row, "scheduled", decision.scheduled_ms, decision)
        return 0 if made is None else 1

    async def _skip(self, row: mstore.MonitorRow, spec: models.MonitorSpec, decision: schedule.Due,
                    now_ms: int) -> int:  # fmt: skip
        next_run = None if decision.next_due_ms is None else decision.next_due_ms + spec.jitter_ms
        check = mstore.CheckRow(
            str(uuid.uuid4()), row.id, "skipped_overlap", "scheduled", row.spec, True,
            decision.scheduled_ms, None, now_ms, models.encode(models.EMPTY_SUMMARY), None,
            f"the previous check ({row.current_check}) was still running", now_ms, now_ms,
        )  # fmt: skip

        def tx(conn: Conn) -> bool:
            if not mstore.claim(conn, row.id, row.next_run_ms or 0, due_ms=decision.next_due_ms,
                                next_run_ms=next_run, check_id=None, at_ms=now_ms):  # fmt: skip
                return False
            mstore.insert_check(conn, check)
            return True

        if not await self.store.write(tx):
            return 0
        monitor_checks.labels("skipped_overlap").inc()
        return 1

    async def _schedule(self) -> None:
        while True:
            self._changed = trio.Event()
            wait = float(self.config.tick)
            try:
                await self.tick(self.clock_ms())
                await self._close_orphans()
                earliest = await self.store.read(mstore.earliest_run_ms)
                if earliest is not None:
                    wait = min(wait, max(0.05, (earliest - self.clock_ms()) / 1000))
            except DB_ERRORS as exc:
                log.warning("monitor scheduler could not reach the store", error=str(exc))
            with trio.move_on_after(wait):
                await self._changed.wait()

    # -- runs ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Resume the open checks, then schedule and run new ones until cancelled."""

        async def scheduler(nursery: trio.Nursery) -> None:
            nursery.start_soon(self._schedule)
            nursery.start_soon(self.notifier.run)

        await self._runs.serve(SCAN_S, task_status, scheduler)

    async def _close_orphans(self) -> None:
        """Open checks whose job ended without them (a DELETE /v2/crawl/{id} while no process
        worked on the check, a kill between the job's end and the check's): a run closes each
        (the scan starts runs only for running jobs)."""
        for check_id in await self.store.read(mstore.orphaned_check_ids):
            if check_id in self.runs:
                continue
            row = await self.store.read(lambda c, i=check_id: mstore.get_check(c, i))  # type: ignore[misc]
            if row is not None:
                self._runs.spawn(row)

    def status(self) -> dict[str, Any]:
        return {"checks_running": len(self.runs), "checks_created": self.checks_created,
                "judged": self.judged, "notifications": self.notifier.status(),
                "checks": {i: r.status() for i, r in list(self.runs.items())}}  # fmt: skip
