# The collector part of the daemon: one TaskCrawler per enabled task, each in its own cancel
# scope inside the collector's nursery, sharing one OctoparseClient (and so one rate limiter) per
# account. Reload diffs the task list: removed tasks are stopped, added ones started, changed ones
# restarted with their new settings; untouched crawlers keep running mid-run.
#
# In cluster mode each task's crawler runs under the lease `collector:<task id>` (only instances
# listing the task compete for it): a task listed on several instances runs on one at a time, a
# task removed by reload gives its lease back, an added one competes for it. The owner also takes
# the start/stop requests other instances leave for the lease (see `hand_over`). A crawler
# counts as started only once its instance has tried for the lease (`_run_owned`), so the API,
# which serves after every crawler started, never sees a task listed here that nobody holds yet:
# an instance alone answers a start with the run's job, as on SQLite, and a request is left only
# for an owner that exists.
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import trio

from daemon.cluster import Cluster, Lease, Request
from daemon.cluster import rules as cluster_rules
from daemon.collector import runrules
from daemon.collector.config import AccountConfig, CollectorSettings, TaskConfig
from daemon.collector.contracts import STORE_FAILURES, AlreadyRunning, CrawlerStopped, JobSink
from daemon.collector.crawler import TaskCrawler
from daemon.collector.octoparse import OctoparseClient
from daemon.config import (
    ConfigDiff,
    WebhookSpec,
    to_builtins,
)
from daemon.logs import get_logger
from daemon.net import tls
from daemon.net.ratelimit import RateLimiter
from daemon.outbox import Outbox
from daemon.store import Store

log = get_logger("collector")
STATUS_WAIT_S = 1.0
"""How long /status waits for the store before showing the collector without it."""
STATUS_FAILURES: tuple[type[BaseException], ...] = (*STORE_FAILURES, trio.TooSlowError)
CLAIM_WAIT_S = 5.0
"""How long a task's crawler, at its start in cluster mode, waits for this instance to try for
the task's lease and run under it, before it counts as started anyway."""


class UnknownTask(Exception):
    pass


class UnknownAccount(Exception):
    pass


class CollectorNotRunning(Exception):
    pass


def lease_name(task_id: str) -> str:
    """The lease whose holder runs the task's crawler."""
    return f"collector:{task_id}"


def removal(config: CollectorSettings, task_id: str) -> str:
    """Why `config` no longer runs the task (the error its run's job ends with)."""
    if not config.collector.enabled:
        return runrules.COLLECTOR_DISABLED
    if any(t.id == task_id for t in config.collector.tasks):
        return runrules.TASK_DISABLED
    return runrules.TASK_REMOVED


def request_webhook(value: Any) -> str | WebhookSpec | None:
    """A start request's webhook back from its JSON form."""
    if value is None or isinstance(value, str):
        return value
    return msgspec.convert(value, WebhookSpec)


@dataclass
class _Running:
    crawler: TaskCrawler
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)
    serving: trio.Event = field(default_factory=trio.Event)
    """Set once the crawler runs under the task's lease (cluster mode), replaced when it stops."""


class Collector:
    def __init__(
        self,
        config: CollectorSettings,
        *,
        store: Store,
        outbox: Outbox,
        stream: str,
        jobs: JobSink | None,
        http: httpx.AsyncClient | None = None,
        cluster: Cluster | None = None,
    ) -> None:
        self.config = config
        self.cluster = cluster
        """None: every listed task runs here (no leases), as in tests of the crawler alone."""
        self.store = store
        self.outbox = outbox
        self.stream = stream
        self.jobs = jobs
        self.http = http
        self.clients: dict[str, OctoparseClient] = {}
        self.crawlers: dict[str, _Running] = {}
        self._nursery: trio.Nursery | None = None

    def _client(self, account: AccountConfig) -> OctoparseClient:
        client = self.clients.get(account.name)
        if client is None or client.account != account:
            assert self.http is not None
            client = OctoparseClient(account, self.http, RateLimiter(account.rate_limit))
            self.clients[account.name] = client
        return client

    def _build(self, task: TaskConfig) -> TaskCrawler:
        accounts = {a.name: a for a in self.config.collector.accounts}
        return TaskCrawler(
            task,
            self.config.collector,
            client=self._client(accounts[task.account]),
            store=self.store,
            outbox=self.outbox,
            stream=self.stream,
            fixed_ttl_ms=self.config.broker.message_ttl_ms,
            jobs=self.jobs,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every enabled task's crawler until cancelled."""
        async with (
            httpx.AsyncClient(trust_env=False, verify=tls.verifying(trust_env=False)) as http,
            trio.open_nursery() as nursery,
        ):
            self.http = http
            self._nursery = nursery
            self.clients.clear()
            try:
                for task in self.enabled_tasks(self.config):
                    await self._start(task)
                task_status.started()
                await trio.sleep_forever()
            finally:
                self._nursery = None
                self.http = None
                self.crawlers.clear()

    @staticmethod
    def enabled_tasks(config: CollectorSettings) -> list[TaskConfig]:
        if not config.collector.enabled:
            return []
        return [t for t in config.collector.tasks if t.enabled]

    async def _start(self, task: TaskConfig) -> None:
        assert self._nursery is not None
        running = _Running(self._build(task))

        async def life(task_status: trio.TaskStatus[None]) -> None:
            try:
                with running.scope:
                    if self.cluster is None:
                        await running.crawler.run(task_status=task_status)
                    else:
                        await self._run_owned(self.cluster, running, task_status)
            finally:
                running.done.set()

        await self._nursery.start(life)
        self.crawlers[task.id] = running

    async def _run_owned(
        self, cluster: Cluster, running: _Running, task_status: trio.TaskStatus[None]
    ) -> None:
        """Run the crawler whenever this instance holds the task's lease. It counts as started
        once it runs under the lease, or (other instances sharing the store) once a try found
        the lease held elsewhere or CLAIM_WAIT_S passed: a start the API serves after that is
        run here or left for an owner that exists, not for nobody. Alone on SQLite the lease is
        always taken at the first try, and the wait is the crawler's own start."""
        name = lease_name(running.crawler.task.id)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                cluster.run_owned, name, functools.partial(self._owned, cluster, running)
            )
            wait_s = CLAIM_WAIT_S if cluster.multi else math.inf
            await _take_and_serve(cluster, name, running, wait_s)
            task_status.started()

    async def _owned(self, cluster: Cluster, running: _Running, lease: Lease) -> None:
        """The crawler's life while this instance holds the task's lease."""
        crawler = running.crawler
        try:
            async with trio.open_nursery() as nursery:
                run = functools.partial(crawler.run, lease, resume_interrupted=cluster.multi)
                # Requests are taken once the crawler knows whether it continues a job, so a
                # stop left while nobody ran the task reaches that job.
                await nursery.start(run)
                running.serving.set()
                if cluster.multi:  # alone, every start and stop is served here directly
                    nursery.start_soon(self._take_requests, cluster, crawler, lease, nursery)
        finally:
            running.serving = trio.Event()

    async def _take_requests(
        self, cluster: Cluster, crawler: TaskCrawler, lease: Lease, nursery: trio.Nursery
    ) -> None:
        while True:
            try:
                requests = await cluster.requests(lease)
            except STORE_FAILURES as exc:  # the lease runs out if the store stays away
                log.warning("cannot read the task's requests", task=crawler.task.id, error=str(exc))
                await trio.sleep(cluster_rules.poll_every_s(cluster.lease_s))
                continue
            for request in requests:
                log.info(
                    "request from another instance",
                    task=crawler.task.id,
                    action=request.action,
                    by=request.from_instance,
                )
                if request.action == "start":
                    nursery.start_soon(self._start_requested, crawler, request)
                elif request.action == "stop":
                    crawler.request_stop()

    async def _start_requested(self, crawler: TaskCrawler, request: Request) -> None:
        try:
            job_id = await crawler.start_now(request_webhook(request.body.get("webhook")))
        except (AlreadyRunning, CrawlerStopped) as exc:
            log.info("requested start not served", task=crawler.task.id, reason=repr(exc))
            return
        log.info("requested run started", task=crawler.task.id, job=job_id)

    def owns(self, task_id: str) -> bool:
        """Whether this instance runs the task now (holds its lease, or needs none)."""
        running = self.crawlers.get(task_id)
        if running is None:
            return False
        if self.cluster is None:
            return True
        lease = running.crawler.lease
        return lease is not None and not lease.lost.is_set()

    async def take_now(self, task_id: str) -> bool:
        """Try at once for the lease of a task this instance lists but does not run (nobody
        else holds it: its owner stopped or died), and wait for the crawler to serve under it:
        a start asked here is then run here rather than left for nobody. False: it is held
        elsewhere, or the crawler did not serve within CLAIM_WAIT_S."""
        running = self.crawlers.get(task_id)
        if running is None or self.cluster is None:
            return self.owns(task_id)
        await _take_and_serve(self.cluster, lease_name(task_id), running, CLAIM_WAIT_S)
        return self.owns(task_id)

    async def owner(self, task_id: str) -> str | None:
        """The instance running the task now (None: nobody holds its lease)."""
        if self.cluster is None:
            return None
        return await self.cluster.holder(lease_name(task_id))

    async def hand_over(self, task_id: str, action: str, body: dict[str, Any]) -> str | None:
        """Leave `action` for the task's owner (or whoever takes its lease next); returns the
        owner now (None: nobody holds the lease yet)."""
        assert self.cluster is not None
        owner = await self.owner(task_id)
        await self.cluster.request(lease_name(task_id), action, body)
        return owner

    async def _stop(self, task_id: str, removed: str | None = None) -> None:
        """Stop the task's crawler; `removed`: why the configuration no longer lists the task
        (its run's job ends `cancelled` saying so). Otherwise (a changed task) the run is cut
        short and the restarted crawler continues its job."""
        running = self.crawlers.pop(task_id, None)
        if running is None:
            return
        running.crawler.removed = removed
        running.scope.cancel()
        await running.done.wait()

    async def apply(
        self, old: CollectorSettings, new: CollectorSettings, change: ConfigDiff
    ) -> None:
        """Reload hook: stop removed/changed crawlers, start added/changed ones."""
        self.config = new
        if self._nursery is None:
            return
        wanted = {t.id: t for t in self.enabled_tasks(new)}
        collector_changed = "collector" in change.sections_changed
        for task_id in list(self.crawlers):
            if task_id not in wanted:
                removed = removal(new, task_id)
                log.info("stopping crawler", task=task_id, reason=removed)
                await self._stop(task_id, removed)
            elif task_id in change.tasks_changed or collector_changed:
                log.info("restarting crawler", task=task_id, reason="its settings changed")
                await self._stop(task_id)
        for task_id, task in wanted.items():
            if task_id not in self.crawlers:
                log.info("starting crawler", task=task_id, reason="reload")
                await self._start(task)

    async def discover(self, account_name: str) -> list[dict[str, Any]]:
        """The account's task groups and their tasks, as Octoparse lists them."""
        accounts = {a.name: a for a in self.config.collector.accounts}
        if account_name not in accounts:
            raise UnknownAccount(account_name)
        if self.http is None:
            raise CollectorNotRunning("the collector is not running")
        client = self._client(accounts[account_name])
        groups = []
        for group in await client.task_groups():
            tasks = await client.tasks(group.group_id)
            groups.append(
                {
                    "taskGroupId": group.group_id,
                    "taskGroupName": group.name,
                    "tasks": [{"taskId": t.task_id, "taskName": t.name} for t in tasks],
                }
            )
        return groups

    def crawler(self, task_id: str) -> TaskCrawler:
        running = self.crawlers.get(task_id)
        if running is None:
            raise UnknownTask(task_id)
        return running.crawler

    def crawler_status(self, crawler: TaskCrawler) -> dict[str, Any]:
        waiting = crawler.continuing
        return {
            "id": crawler.task.id,
            "running": crawler.running,
            "current_run": to_builtins(crawler.current) if crawler.current else None,
            "continuing": to_builtins(waiting) if waiting and not crawler.current else None,
            "last_run": to_builtins(crawler.last_result) if crawler.last_result else None,
            "next_run_ms": crawler.next_run_ms,
            "high_water": crawler.high_water,
            "rows": to_builtins(crawler.totals),
        }

    def tasks(self) -> list[dict[str, Any]]:
        """Every configured task, with its settings (no secrets live in them) and progress."""
        result = []
        for task in self.config.collector.tasks:
            running = self.crawlers.get(task.id)
            entry: dict[str, Any] = {
                "settings": to_builtins(task),
                "active": running is not None,
            }
            if running is not None:
                entry["progress"] = self.crawler_status(running.crawler)
            result.append(entry)
        return result

    async def status(self) -> dict[str, Any]:
        """Each crawler's runs; in cluster mode who owns each task (`owner_unknown` while the
        store does not answer: the runs shown are still this instance's truth)."""
        tasks = []
        for task_id, running in self.crawlers.items():
            entry = self.crawler_status(running.crawler)
            if self.cluster is not None:
                entry["owned"] = self.owns(task_id)
                try:
                    with trio.fail_after(STATUS_WAIT_S):
                        entry["owner"] = await self.owner(task_id)
                except STATUS_FAILURES as exc:
                    entry["owner"] = self.cluster.instance if entry["owned"] else None
                    entry["owner_unknown"] = f"the store does not answer ({type(exc).__name__})"
            tasks.append(entry)
        return {"tasks": tasks, "stream": self.stream}


async def _take_and_serve(cluster: Cluster, name: str, running: _Running, wait_s: float) -> None:
    """Have the cluster try for the task's lease `name` at once and, when this instance takes
    it, wait for the crawler to serve under it; at most `wait_s`."""
    with trio.move_on_after(wait_s):
        if await cluster.try_now(name):
            await running.serving.wait()
