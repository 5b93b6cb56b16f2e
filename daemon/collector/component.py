# Wires the collector into the daemon: the queue its rows go to (RabbitMQ through a drainer, or
# the embedded queue), the crawlers, the HTTP routes, the /status sections and the reload hook.
# In cluster mode every instance keeps its broker connection (for /consume and /queue/size) but
# only the holder of the lease `outbox:<stream>` drains the stream to RabbitMQ.
from __future__ import annotations

from typing import Any

import trio

from daemon import metrics, outbox
from daemon.broker import BrokerSettings, open_amqp_broker
from daemon.collector.queue import AmqpQueue, EmbeddedQueue, RowQueue, stream_name
from daemon.collector.service import STATUS_FAILURES, STATUS_WAIT_S, Collector
from daemon.config import resolve_secret
from daemon.logs import get_logger
from daemon.process import Daemon
from daemon.settings import Config

log = get_logger("collector")


def install(daemon: Daemon) -> None:
    from daemon.api import collector as collector_api

    cfg = daemon.config
    assert daemon.store is not None and daemon.outbox is not None
    stream = stream_name(cfg.broker.queue)
    queue: RowQueue
    if cfg.broker.kind == "amqp":
        amqp = AmqpQueue(daemon.outbox, cfg.broker.queue, cfg.broker.confirm_window)
        queue = amqp

        async def run_broker(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
            broker_cfg = daemon.config.broker
            password = resolve_secret(broker_cfg.password_env, "$.broker.password_env")
            settings = BrokerSettings.from_config(broker_cfg, password)
            async with open_amqp_broker(settings) as broker:
                amqp.broker = broker
                task_status.started()
                try:
                    # Alone on SQLite nobody can take the stream over: no fencing to do.
                    assert daemon.cluster is not None
                    multi = daemon.cluster.multi
                    await daemon.cluster.run_owned(
                        drainer_lease(stream),
                        lambda lease: amqp.drain(broker, lease=lease if multi else None),
                    )
                finally:
                    amqp.broker = None

        daemon.add_component("broker", run_broker)
    else:
        queue = EmbeddedQueue(daemon.outbox, cfg.broker.queue)

    collector = Collector(
        cfg,
        store=daemon.store,
        outbox=daemon.outbox,
        stream=stream,
        jobs=getattr(daemon, "jobs", None),
        cluster=daemon.cluster,
    )

    async def run_collector(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
        await warn_about_other_queues(daemon, stream)
        await collector.run(task_status=task_status)

    daemon.parts["collector"] = collector
    daemon.parts["queue"] = queue
    daemon.add_component("collector", run_collector)
    daemon.routes.extend(collector_api.routes(daemon, collector, queue))

    async def collector_section() -> dict[str, Any]:
        section = await collector.status()
        assert daemon.outbox is not None
        try:
            with trio.fail_after(STATUS_WAIT_S):
                pending = await daemon.outbox.state(stream)
        except STATUS_FAILURES:
            return section  # the runs are shown; the queue's depth waits for the store
        section["undelivered"] = pending.pending
        section["oldest_undelivered_ms"] = pending.oldest_ms
        return section

    async def broker_section() -> dict[str, Any]:
        return queue.status()

    async def refresh_pending() -> None:
        assert daemon.outbox is not None
        metrics.outbox_pending.labels(stream).set((await daemon.outbox.state(stream)).pending)

    daemon.metric_refreshers.append(refresh_pending)
    daemon.status_sections["collector"] = collector_section
    daemon.status_sections["broker"] = broker_section
    daemon.reload_hooks.append(collector.apply)


async def warn_about_other_queues(daemon: Daemon, stream: str) -> None:
    """Rows left in the stream of a queue the config no longer names are not delivered by
    anyone: say so at start, with what to do."""
    assert daemon.store is not None and daemon.outbox is not None
    names = await daemon.store.read(lambda c: outbox.list_streams(c, "queue:"))
    for name in names:
        if name == stream:
            continue
        state = await daemon.outbox.state(name)
        if state.pending:
            log.warning(
                "undelivered rows wait for a queue this config does not use; restore its"
                " [broker] queue name (or kind) to deliver them",
                stream=name,
                rows=state.pending,
            )


def drainer_lease(stream: str) -> str:
    """The lease whose holder publishes `stream` to RabbitMQ."""
    return f"outbox:{stream}"


def check_secrets(cfg: Config) -> None:
    """The broker password and the credentials of every account an enabled task uses."""
    if cfg.broker.kind == "amqp":
        resolve_secret(cfg.broker.password_env, "$.broker.password_env")
    if not cfg.collector.enabled:
        return
    used = {t.account for t in cfg.collector.tasks if t.enabled}
    for i, account in enumerate(cfg.collector.accounts):
        if account.name not in used:
            continue
        path = f"$.collector.accounts[{i}]"
        if account.api_key_env is not None:
            resolve_secret(account.api_key_env, f"{path}.api_key_env")
        else:
            resolve_secret(account.password_env, f"{path}.password_env")
