# The tracker's Prometheus metrics (specs/tracker.md, Interface), on the process registry. Lag —
# how late a snapshot ran against its planned time — is the tracker's key service level, so it
# is a histogram with buckets around the 1 s and 15 s ticks.
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from daemon.metrics import REGISTRY

snapshots = Counter(
    "crawld_tracker_snapshots",
    "Snapshots stored, by the schedule type that took them (new, milestone, normal, archive;"
    " ingest for the first one)",
    ["type"],
    registry=REGISTRY,
)
schedule_lag = Histogram(
    "crawld_tracker_schedule_lag_seconds",
    "How late a snapshot ran against its planned time, by schedule type",
    ["type"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300),
    registry=REGISTRY,
)
stale_finishes = Counter(
    "crawld_tracker_stale_finishes",
    "Snapshots dropped because their schedule was reclaimed by another instance meanwhile (this"
    " process was paused past its lease)",
    registry=REGISTRY,
)
upstream_errors = Counter(
    "crawld_tracker_upstream_errors",
    "Bilibili answers with code != 0 (by code) and failed requests (code=network)",
    ["code"],
    registry=REGISTRY,
)
no_proxy = Counter(
    "crawld_tracker_no_proxy",
    "Requests not sent because every proxy of the task kind was rate-limited",
    ["task"],
    registry=REGISTRY,
)
schedules = Gauge(
    "crawld_tracker_schedules",
    "Schedule rows by type and status",
    ["type", "status"],
    registry=REGISTRY,
)
