# The webhook metrics in one place: the counters and histograms the deliverer, the drainers and
# the manager's degraded mode move as events reach an outcome, and the scrape-time gauges read from
# every live manager's jobs. Several daemons may share a test process, so the gauges sum over a
# weak set of managers instead of holding one.
from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from daemon import outbox as outbox_mod
from daemon.metrics import REGISTRY

if TYPE_CHECKING:
    from daemon.jobs.jobstate import JobState

OUTCOMES = ("delivered", "failed", "blocked", "skipped", "degraded", "dropped")
EVENTS = Counter(
    "crawld_webhook_events",
    "Webhook events by outcome: delivered, failed (retries exhausted, 410, invalid settings), "
    "blocked (SSRF guard) and skipped (not sent: the endpoint answered 410 Gone earlier) are "
    "final; degraded counts events queued in memory because the store failed; dropped counts "
    "memory-queued events lost at shutdown",
    ["outcome"],
    registry=REGISTRY,
)
ATTEMPTS = Counter(
    "crawld_webhook_attempts",
    "Webhook HTTP attempts by result: 2xx, 3xx, 4xx, 5xx, timeout, connect, dns, network, "
    "blocked, error (the request could not be built or sent)",
    ["result"],
    registry=REGISTRY,
)
DELIVERY_SECONDS = Histogram(
    "crawld_webhook_delivery_seconds",
    "Time from a webhook event being queued to its delivery (2xx)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
    registry=REGISTRY,
)
ATTEMPT_SECONDS = Histogram(
    "crawld_webhook_attempt_seconds",
    "Duration of one webhook HTTP attempt",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
for _outcome in OUTCOMES:
    EVENTS.labels(_outcome)


class JobsInMemory(Protocol):
    def jobs_in_memory(self) -> list[JobState]:
        """The jobs with live webhook state in this process."""
        ...


LIVE: weakref.WeakSet[JobsInMemory] = weakref.WeakSet()
"""Every live JobManager (it adds itself)."""


class _WebhookGauges(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        lag = GaugeMetricFamily(
            "crawld_webhook_cursor_lag",
            "Webhook events of a job issued but not yet at a final outcome",
            labels=["job"],
        )
        oldest = GaugeMetricFamily(
            "crawld_webhook_oldest_pending_seconds",
            "Age of the oldest webhook event being delivered (0 when none)",
        )
        now = outbox_mod.now_ms()
        heads = []
        for manager in list(LIVE):
            for job in manager.jobs_in_memory():
                if job.webhook is not None and (job.pending or job.drainer):
                    lag.add_metric([job.id], job.pending)
                if job.head_ms is not None:
                    heads.append(job.head_ms)
        oldest.add_metric([], (now - min(heads)) / 1000 if heads else 0.0)
        yield lag
        yield oldest


REGISTRY.register(_WebhookGauges())
