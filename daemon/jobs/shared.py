# What the JobManager's rooms share. The manager is one object (the API, the collector and the
# crawl hold it), written as a few mixins by responsibility: records (reads), numbering (events in
# a producer's transaction), degraded mode, the cluster scan and expiry. This base declares the
# state JobManager.__init__ sets and the methods one room calls in another, so each room is typed
# on its own; the stubs here are only reached if a room is used without JobManager.
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from daemon.cluster import Cluster, Lease
    from daemon.config import JobsConfig
    from daemon.jobs.degraded import UnsavedFinish
    from daemon.jobs.delivery import Deliverer
    from daemon.jobs.jobstate import JobState
    from daemon.jobs.types import JobRecord
    from daemon.outbox import Outbox
    from daemon.store import Store


class ManagerState:
    store: Store
    cluster: Cluster | None
    """Drainers and expiry run under its leases; None: this process alone (tests)."""
    outbox: Outbox
    jobs_cfg: JobsConfig
    clock_ms: Callable[[], int]
    deliverer: Deliverer
    _active: dict[str, JobState]
    """The jobs with live webhook state in this process."""
    _unsaved: dict[str, UnsavedFinish]
    """Final statuses the store refused, kept until the cleanup loop saves them."""
    _nursery: trio.Nursery | None
    _stopping: bool
    _push_scopes: set[trio.CancelScope]
    _backlog_seen: bool
    """The last cluster scan found undelivered events (it looks again within a tick)."""

    def _spawn(self, job: JobState, lease: Lease | None = None) -> None:
        raise NotImplementedError

    def _state_from(self, record: JobRecord, pending: int) -> JobState:
        raise NotImplementedError

    async def _save_unsaved(self) -> None:
        raise NotImplementedError
