# Wires cluster mode into the daemon: the Cluster object every area reaches as `daemon.cluster`,
# the component that heartbeats and keeps leases (first in start order, so areas can take leases
# as they start), the /status section, the metrics and the offers other members compare.
from __future__ import annotations

from typing import Any

import msgspec
import trio
from prometheus_client import Counter, Gauge

from daemon import config, metrics
from daemon.cluster import Cluster, Offers, rules
from daemon.process import Daemon
from daemon.settings import Config, ConfigDiff

members_gauge = Gauge(
    "crawld_cluster_members",
    "Instances in the member table, alive or expired",
    ["state"],
    registry=metrics.REGISTRY,
)
leases_held = Gauge(
    "crawld_cluster_leases_held",
    "Leases this instance holds",
    registry=metrics.REGISTRY,
)
lease_events = Counter(
    "crawld_cluster_lease_events",
    "Leases this instance took, lost (another instance took them, or no renewal in time) and"
    " released",
    ["event"],
    registry=metrics.REGISTRY,
)


wakeups_listening = Gauge(
    "crawld_cluster_wakeups_listening",
    "1 while this instance's LISTEN connection (wake-ups from other instances) is up",
    registry=metrics.REGISTRY,
)
wakeup_events = Counter(
    "crawld_cluster_wakeups",
    "Wake-ups received from other instances, and reconnections of the LISTEN connection",
    ["event"],
    registry=metrics.REGISTRY,
)


def offers_for(cfg: Config) -> Offers:
    """What this config brings to the cluster, as digests the other members compare."""
    accounts = {a.name: a for a in cfg.collector.accounts}
    return Offers(
        lease_ms=int(cfg.cluster.lease * 1000),
        tasks={
            t.id: rules.digest([config.to_builtins(t), config.to_builtins(accounts[t.account])])
            for t in cfg.collector.tasks
            if t.enabled
        },
        proxies={
            p.name: rules.digest(config.to_builtins(p))
            for p in cfg.tracker.proxies
            if p.kind != "direct"
        },
        shared={
            "broker": rules.digest([cfg.broker.kind, cfg.broker.queue, cfg.broker.queue_type]),
            # Whether events are signed, and where they may go: a failover must not change
            # either. The secret itself is never compared (not even as a digest).
            "webhooks": rules.digest(
                [cfg.webhooks.secret_env is not None, sorted(cfg.webhooks.allow_cidrs)]
            ),
        },
    )


def install(daemon: Daemon) -> None:
    assert daemon.store is not None
    cfg = daemon.config

    def address() -> str | None:
        if daemon.http_address is None:
            return None
        host, port = daemon.http_address
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    cluster = Cluster(
        daemon.store,
        instance=config.instance_name(cfg),
        lease_s=cfg.cluster.lease,
        multi=daemon.store.backend.shared,
        offers=offers_for(cfg),
        address=address,
    )
    daemon.cluster = cluster

    async def run(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
        await cluster.run(task_status=task_status)

    async def section() -> dict[str, Any]:
        return await cluster.view()

    reported = dict.fromkeys(cluster.counters, 0)
    woken = dict.fromkeys(cluster.store.wakeups.counters, 0)

    async def refresh() -> None:
        view = await cluster.view()
        alive = sum(1 for m in view["members"] if m["alive"])
        members_gauge.labels("alive").set(alive)
        members_gauge.labels("expired").set(len(view["members"]) - alive)
        leases_held.set(len(cluster.held))
        for event, count in cluster.counters.items():
            lease_events.labels(event).inc(count - reported[event])
            reported[event] = count
        wakeups = cluster.store.wakeups
        wakeups_listening.set(1 if wakeups.listening else 0)
        for event, count in wakeups.counters.items():
            wakeup_events.labels(event).inc(count - woken[event])
            woken[event] = count

    async def on_reload(old: Config, new: Config, change: ConfigDiff) -> None:
        # [cluster] itself takes effect at the next restart; the rest is offered at once.
        cluster.offers = msgspec.structs.replace(offers_for(new), lease_ms=cluster.lease_ms)

    daemon.add_component("cluster", run)
    daemon.status_sections["cluster"] = section
    daemon.metric_refreshers.append(refresh)
    daemon.reload_hooks.append(on_reload)
