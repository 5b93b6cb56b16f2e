# Event numbering: why events are issued where they are. A job's state change and the event
# announcing it commit in ONE store transaction (`page_in_tx` runs inside the collector's own
# window transaction), so whatever a webhook points to is readable before it is sent, and a crash
# can lose neither. The seq comes from the job row in that transaction (`jobstore.issue_seq`), so
# the store's single writer is the lock that makes queue order = seq order = delivery order, and
# a rolled-back transaction leaves no gap. `after_commit` then wakes the drainer, or (memory mode,
# degraded jobs) puts the numbered event in the job's bounded memory queue, waiting while it is
# full.
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from daemon import outbox as outbox_mod
from daemon.config import WebhookFields
from daemon.jobs import events
from daemon.jobs import store as jobstore
from daemon.jobs.shared import ManagerState
from daemon.jobs.types import JobRecord
from daemon.outbox import NewItem
from daemon.store import Conn


@dataclass
class PendingEvents:
    """What a transaction issued for a job; pass it to `after_commit` once it committed."""

    job_id: str
    durable: list[NewItem] = field(default_factory=list)
    """Events appended to the job's outbox stream in the transaction."""
    memory: list[NewItem] = field(default_factory=list)
    """Numbered events for the job's memory queue, in seq order."""
    terminal: bool = False
    degraded: bool = False
    first_row: int | None = None
    """`n` of the first job row the transaction stored (`page_in_tx`), None when none was kept."""


def seq_of(item: NewItem) -> int:
    return int(item.meta["seq"])


def new_item(
    kind: str,
    job_id: str,
    webhook: WebhookFields,
    name: str,
    seq: int,
    data: list[Any],
    error: str | None,
) -> NewItem:
    webhook_id = str(uuid.uuid4())
    body = events.build_body(
        kind=kind,
        name=name,
        job_id=job_id,
        seq=seq,
        webhook_id=webhook_id,
        data=data,
        error=error,
        metadata=webhook.metadata,
    )
    return NewItem(
        key=webhook_id, body=events.encode_body(body), meta={"type": body.type, "seq": seq}
    )


class EventNumbering(ManagerState):
    def _event_in_tx(
        self,
        conn: Conn,
        record: JobRecord,
        name: str,
        data: list[Any],
        error: str | None,
        pending: PendingEvents,
    ) -> None:
        if record.webhook is None:
            return
        job = self._active.get(record.id)
        seq = jobstore.issue_seq(conn, record, name, job.last_seq if job else 0)
        if seq is None:
            return
        item = new_item(record.kind, record.id, record.webhook, name, seq, data, error)
        durable = job.durable and not job.degraded if job else self.jobs_cfg.store
        if durable:
            outbox_mod.append(conn, jobstore.stream_name(record.id), [item], self.clock_ms())
            pending.durable.append(item)
        else:
            pending.memory.append(item)
            pending.degraded = job is not None and job.durable
