# One Prometheus registry for the process. Each area declares its own metrics next to its code
# (prometheus-client's module-level style); values computed at scrape time come from collectors
# that the running Daemon registers and unregisters, so several daemons in one test process do
# not clash.
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)

component_restarts = Counter(
    "crawld_component_restarts",
    "Restarts of a supervised component after a failure",
    ["component"],
    registry=REGISTRY,
)
reloads = Counter(
    "crawld_reloads", "Configuration reloads by result", ["result"], registry=REGISTRY
)
config_generation = Gauge(
    "crawld_config_generation", "Generation of the running configuration", registry=REGISTRY
)


def render(instance: str | None = None) -> bytes:
    """The exposition text; with `instance` (cluster mode) every sample carries
    `instance="<name>"`, so one dashboard tells the members apart."""
    text = generate_latest(REGISTRY)
    if instance is None:
        return text
    label = b'instance="' + instance.encode() + b'"'
    out = []
    for line in text.split(b"\n"):
        if line and not line.startswith(b"#"):
            name, sep, rest = line.partition(b"{")
            if sep:
                line = name + b"{" + label + (b"," if not rest.startswith(b"}") else b"") + rest
            else:
                name, _, value = line.partition(b" ")
                line = name + b"{" + label + b"} " + value
        out.append(line)
    return b"\n".join(out)


collector_rows = Counter(
    "crawld_collector_rows",
    "Rows seen by the collector, by task and outcome "
    "(fetched, published, duplicate, and the drop reasons expired/missing/unparseable)",
    ["task", "outcome"],
    registry=REGISTRY,
)
collector_runs = Counter(
    "crawld_collector_runs",
    "Finished collector runs by task and status (completed, stopped, cancelled, failed)",
    ["task", "status"],
    registry=REGISTRY,
)
queue_published = Counter(
    "crawld_queue_published",
    "Messages confirmed by RabbitMQ (or expired before publishing), by queue",
    ["queue", "outcome"],
    registry=REGISTRY,
)
queue_publish_failures = Counter(
    "crawld_queue_publish_failures",
    "Publish batches that failed and were retried, by queue",
    ["queue"],
    registry=REGISTRY,
)
outbox_pending = Gauge(
    "crawld_outbox_pending",
    "Items appended to an outbox stream and not yet acknowledged",
    ["stream"],
    registry=REGISTRY,
)
