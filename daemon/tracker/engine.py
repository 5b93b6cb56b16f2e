# The tracker's moving parts: discovery, ingest, classification, the 1 s snapshot tick, the 15 s
# bulk tick, the dispatchers and cleanup. Each is a short async step that moves data between the
# pure rules (rules.py), the store (store.py, one writer transaction per step) and the network
# (the Bilibili client and the classifier, passed in so tests can hand in fakes).
#
# Crash safety comes from where the transactions are cut: a schedule is claimed ("processing") in
# one transaction before its request goes out, and the snapshot it produced is stored in the same
# transaction that completes the schedule and chains the next one. A kill -9 between the two
# leaves a processing row, which the next start turns back into a pending one (planned now), so
# the schedule runs again and its snapshot is stored exactly once. Discovered aids wait in the
# store's ingest queue and leave it in the transaction that stores their metadata.
#
# In a cluster every instance runs the ticks: a claim stamps the rows with this process's
# claimant, and the transaction that stores a snapshot first finishes the schedule only if it
# is still processing by that claimant (a process paused past its lease, whose rows another
# instance took, stores nothing). The steps that run in one place (discovery, ingest, the
# dispatchers, cleanup) run under a lease set in FENCE, and every write they make checks it.
#
# A tick claims only what this process's proxies can send within the tick ("claim what you can
# do now", as the crawl workers do): as many requests as their limits let through before the
# next tick (`room`), less the ones it claimed and has not sent yet. The due rows beyond that
# stay pending, in order, for the instance whose proxies have room: otherwise the first tick
# to run would claim every due row and wait on its own proxies while the others idle. A claimed
# request that finds no room after all (another task took it) hands its rows back the same way.
# Rows about to leave the tick's lookback are claimed and retried as the spec says regardless.
#
# The steps are written by job in daemon/tracker/steps/ (ingest, classify, ticks, dispatch, over
# the shared state of base.py); `Tracker` is all of them over one store.
from __future__ import annotations

from daemon.tracker.steps.base import (
    BULK_CONCURRENCY,
    DISCOVERY_MAX_PAGES,
    DISCOVERY_PAGE_SIZE,
    DISPATCH_BATCH,
    FENCE,
    LAG_WINDOW_MS,
    LOCAL_CLAIMANT,
    NO_PROXY_INGEST_RETRY_MS,
    ROOM_WAIT_MAX_MS,
    TICK_ROOM_WAIT_MAX_MS,
    AlreadyTracked,
    Client,
    TrackerStats,
)
from daemon.tracker.steps.classify import ClassifySteps
from daemon.tracker.steps.dispatch import DispatchSteps
from daemon.tracker.steps.ingest import IngestSteps
from daemon.tracker.steps.ticks import TickSteps

__all__ = [
    "BULK_CONCURRENCY", "DISCOVERY_MAX_PAGES", "DISCOVERY_PAGE_SIZE", "DISPATCH_BATCH", "FENCE",
    "LAG_WINDOW_MS", "LOCAL_CLAIMANT", "NO_PROXY_INGEST_RETRY_MS", "ROOM_WAIT_MAX_MS",
    "TICK_ROOM_WAIT_MAX_MS", "AlreadyTracked", "Client", "Tracker", "TrackerStats",
]  # fmt: skip


class Tracker(IngestSteps, ClassifySteps, TickSteps, DispatchSteps):
    """The tracker's steps over one store, one Bilibili client and one classifier."""
