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


def render() -> bytes:
    return generate_latest(REGISTRY)
