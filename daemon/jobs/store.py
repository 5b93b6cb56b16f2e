# The jobs tables (migration 0002) as plain functions over an APSW connection. They run inside a
# caller's transaction (the store's writer, or a reader's snapshot), so a job's status, counters,
# rows, errors and webhook events always change together; nothing here knows about trio.
#
# The records these functions return are the part's typed interface (daemon/jobs/types.py); they
# are importable from here too for the areas' code that writes jobs.
#
# Event numbering lives here too: `issue_seq` applies `events.Sequencer` to the job row, so the
# last seq issued and the "terminal already issued" flag are read and written in the same
# transaction that stores the event, and roll back with it.
from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from daemon.config import WebhookFields, WebhookSpec
from daemon.jobs.events import WEBHOOK_FAILED, Sequencer, gone_error
from daemon.jobs.types import (
    FINISHED,
    KINDS,
    Delivery,
    GoneMark,
    JobError,
    JobFinished,
    JobNotFound,
    JobRecord,
)
from daemon.jobs.types import (
    ROBOTS_BLOCKED as ROBOTS_BLOCKED,  # the crawl's error code, named here too
)
from daemon.outbox import ack, drop_stream
from daemon.store import Conn, in_list, one

_encode = msgspec.json.Encoder().encode
_webhook_decoder = msgspec.json.Decoder(WebhookSpec)
_unchecked_webhook_decoder = msgspec.json.Decoder(WebhookFields)
_source_decoder = msgspec.json.Decoder(dict[str, Any])

_COLUMNS = (
    "id, kind, status, completed, total, created_ms, completed_ms, expires_ms, webhook, source,"
    " last_seq, terminated, error"
)


STREAM_PREFIX = "webhook:"


def stream_name(job_id: str) -> str:
    """The outbox stream holding a job's webhook events (and, in cluster mode, the name of the
    lease its drainer runs under)."""
    return f"{STREAM_PREFIX}{job_id}"


def decode_webhook(raw: bytes | None) -> WebhookFields | None:
    """The stored setting: a WebhookSpec, or unchecked WebhookFields when today's rules refuse
    what an older crawld stored (the drainer then fails its events softly)."""
    if raw is None:
        return None
    try:
        return _webhook_decoder.decode(raw)
    except msgspec.ValidationError:
        return _unchecked_webhook_decoder.decode(raw)


def _record(row: Sequence[Any]) -> JobRecord:
    (id_, kind, status, completed, total, created, done, expires, hook, source, seq, term, err) = (
        row
    )
    return JobRecord(
        id=id_,
        kind=kind,
        status=status,
        completed=completed,
        total=total,
        created_ms=created,
        completed_ms=done,
        expires_ms=expires,
        webhook=decode_webhook(hook),
        source=_source_decoder.decode(source),
        last_seq=seq,
        terminated=bool(term),
        error=err,
    )


def insert_job(
    conn: Conn,
    *,
    job_id: str,
    kind: str,
    webhook: WebhookFields | None,
    source: dict[str, Any],
    at_ms: int,
    expires_ms: int,
) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown job kind {kind!r}; expected one of {sorted(KINDS)}")
    conn.execute(
        "INSERT INTO jobs(id, kind, status, created_ms, expires_ms, webhook, source)"
        " VALUES (?, ?, 'scraping', ?, ?, ?, ?)",
        (
            job_id,
            kind,
            at_ms,
            expires_ms,
            None if webhook is None else _encode(webhook),
            _encode(source),
        ),
    )


def get_job(conn: Conn, job_id: str) -> JobRecord | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return None if row is None else _record(row)


def require_running(conn: Conn, job_id: str) -> JobRecord:
    """The job's record; JobNotFound, or JobFinished when it already has a final status.

    Locks the job's row first: on PostgreSQL several instances may write for one job (a crawl's
    pages, a cancel), and the rows, counts and event numbers that follow in this transaction
    must not be read by two at once (SQLite's one writer needs no lock; this costs it a no-op)."""
    conn.execute("UPDATE jobs SET last_seq = last_seq WHERE id = ?", (job_id,))
    record = get_job(conn, job_id)
    if record is None:
        raise JobNotFound(job_id)
    if record.finished:
        raise JobFinished(job_id, record.status)
    return record


def add_rows(
    conn: Conn,
    job_id: str,
    rows: Sequence[Any],
    total: int | None = None,
    *,
    keep: bool = True,
) -> int | None:
    """Store rows after the job's earlier ones and count them as completed (`keep=False`: count
    them only, e.g. a zeroDataRetention crawl whose documents go to its webhook alone).

    Returns the number `n` of the first row stored (the others follow it), None when not kept.
    """
    first: int | None = None
    if keep:
        (last,) = one(conn, "SELECT coalesce(max(n), 0) FROM job_rows WHERE job_id = ?", (job_id,))
        first = last + 1
        conn.executemany(
            "INSERT INTO job_rows(job_id, n, body) VALUES (?, ?, ?)",
            ((job_id, last + i, _encode(row)) for i, row in enumerate(rows, start=1)),
        )
    conn.execute(
        "UPDATE jobs SET completed = completed + ?, total = max(total, completed + ?, ?)"
        " WHERE id = ?",
        (len(rows), len(rows), total or 0, job_id),
    )
    return first


def set_total(conn: Conn, job_id: str, total: int) -> None:
    """Set the job's `total` (completed + pending), which may go down when pages fail."""
    conn.execute("UPDATE jobs SET total = max(?, completed) WHERE id = ?", (total, job_id))


def issue_seq(conn: Conn, record: JobRecord, name: str, floor: int = 0) -> int | None:
    """Number event `name` of a job with a webhook (None: its filter drops it) and remember it.

    `floor` is the highest seq the caller knows was issued outside the store (events numbered in
    memory while the store failed), so numbers never repeat within a process.
    """
    if record.webhook is None:
        raise ValueError("a job without a webhook has no events")
    # Read under the row's lock (see require_running): two instances never issue one number.
    row = one(
        conn,
        "UPDATE jobs SET last_seq = last_seq WHERE id = ? RETURNING last_seq, terminated",
        (record.id,),
    )
    seqr = Sequencer(
        kind=record.kind,
        events=list(record.webhook.events),
        last_seq=max(row[0], floor),
        terminated=bool(row[1]),
    )
    seq = seqr.issue(name)
    conn.execute(
        "UPDATE jobs SET last_seq = ?, terminated = ? WHERE id = ?",
        (seqr.last_seq, int(seqr.terminated), record.id),
    )
    return seq


def set_finished(
    conn: Conn,
    job_id: str,
    status: str,
    error: str | None,
    at_ms: int,
    expires_ms: int,
) -> JobRecord:
    """Give a running job its final status; returns the record as it was before."""
    if status not in FINISHED:
        raise ValueError(f"{status!r} is not a final job status")
    record = require_running(conn, job_id)
    conn.execute(
        "UPDATE jobs SET status = ?, error = ?, completed_ms = ?, expires_ms = ?, terminated = 1"
        " WHERE id = ?",
        (status, error, at_ms, expires_ms, job_id),
    )
    return record


def add_error(
    conn: Conn,
    job_id: str,
    *,
    code: str | None,
    error: str,
    url: str | None,
    at_ms: int,
) -> str:
    """Append to the job's error list; returns the error's id."""
    (last,) = one(conn, "SELECT coalesce(max(n), 0) FROM job_errors WHERE job_id = ?", (job_id,))
    error_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO job_errors(job_id, n, id, at_ms, url, code, error)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (job_id, last + 1, error_id, at_ms, url, code, error),
    )
    return error_id


def webhook_gone(conn: Conn, job_id: str) -> GoneMark | None:
    row = conn.execute(
        "SELECT event_id, type, error_id, skipped FROM webhook_gone WHERE job_id = ?", (job_id,)
    ).fetchone()
    if row is None:
        return None
    event_id, type_, error_id, skipped = row
    return GoneMark(event_id=event_id, type=type_, error_id=error_id, skipped=skipped)


def mark_gone(
    conn: Conn,
    job_id: str,
    *,
    event_id: str,
    type_: str,
    url: str,
    at_ms: int,
    stream: str | None,
    seq: int,
) -> GoneMark:
    """Record that event `event_id` got 410 Gone: ONE job error, the mark, and (with `stream`,
    the job's outbox stream, `seq` the event's place in it) the cursor moved past everything
    queued so far, which counts as skipped. `url` must already be redacted."""
    skipped = 0
    if stream is not None:
        (skipped,) = one(
            conn,
            "SELECT count(*) FROM outbox_items WHERE stream = ? AND seq > ?",
            (stream, seq),
        )
        (last,) = one(
            conn,
            "SELECT coalesce(max(last_seq), 0) FROM outbox_streams WHERE stream = ?",
            (stream,),
        )
        ack(conn, stream, max(last, seq))
    error_id = add_error(
        conn,
        job_id,
        code=WEBHOOK_FAILED,
        error=gone_error(event_id, type_, skipped),
        url=url,
        at_ms=at_ms,
    )
    conn.execute(
        "INSERT INTO webhook_gone(job_id, event_id, type, error_id, skipped, at_ms)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(job_id) DO UPDATE SET"
        " event_id = excluded.event_id, type = excluded.type, error_id = excluded.error_id,"
        " skipped = excluded.skipped, at_ms = excluded.at_ms",
        (job_id, event_id, type_, error_id, skipped, at_ms),
    )
    return GoneMark(event_id=event_id, type=type_, error_id=error_id, skipped=skipped)


def skip_gone(
    conn: Conn, job_id: str, count: int, *, stream: str | None = None, upto: int = 0
) -> GoneMark | None:
    """Count `count` more events of a gone job as not sent (acking `stream` up to `upto`), and
    rewrite the job's one gone error to say so. None if the job has no gone mark."""
    if stream is not None:
        ack(conn, stream, upto)
    conn.execute("UPDATE webhook_gone SET skipped = skipped + ? WHERE job_id = ?", (count, job_id))
    mark = webhook_gone(conn, job_id)
    if mark is not None:
        conn.execute(
            "UPDATE job_errors SET error = ? WHERE job_id = ? AND id = ?",
            (gone_error(mark.event_id, mark.type, mark.skipped), job_id, mark.error_id),
        )
    return mark


class RetryState(msgspec.Struct, frozen=True, kw_only=True):
    """The stored schedule of the event at a job's cursor (migration 0012): `attempts` made, the
    next not before `next_ms` (epoch ms), and how the last one ended."""

    job_id: str
    seq: int
    attempts: int
    next_ms: int
    last_status: int | None
    last_error: str
    at_ms: int


_RETRY_COLUMNS = "job_id, seq, attempts, next_ms, last_status, last_error, at_ms"


def _retry(row: Sequence[Any]) -> RetryState:
    job_id, seq, attempts, next_ms, status, error, at = row
    return RetryState(
        job_id=job_id, seq=seq, attempts=attempts, next_ms=next_ms, last_status=status,
        last_error=error, at_ms=at,
    )  # fmt: skip


def retry_state(conn: Conn, job_id: str) -> RetryState | None:
    """What is stored about the retries of the event at the job's cursor, or None."""
    row = conn.execute(
        f"SELECT {_RETRY_COLUMNS} FROM webhook_attempts WHERE job_id = ?", (job_id,)
    ).fetchone()
    return None if row is None else _retry(row)


def save_retry(conn: Conn, state: RetryState) -> None:
    """Store (or replace) the retry state of the job's event at its cursor."""
    conn.execute(
        f"INSERT INTO webhook_attempts({_RETRY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(job_id) DO UPDATE SET seq = excluded.seq, attempts = excluded.attempts,"
        " next_ms = excluded.next_ms, last_status = excluded.last_status,"
        " last_error = excluded.last_error, at_ms = excluded.at_ms",
        (state.job_id, state.seq, state.attempts, state.next_ms, state.last_status,
         state.last_error, state.at_ms),
    )  # fmt: skip


def clear_retry(conn: Conn, job_id: str) -> None:
    """Forget the job's retry state (its event has a final outcome)."""
    conn.execute("DELETE FROM webhook_attempts WHERE job_id = ?", (job_id,))


def retrying(conn: Conn, limit: int) -> tuple[int, list[RetryState]]:
    """How many jobs have an event waiting for a retry, and the `limit` due soonest."""
    (count,) = one(conn, "SELECT count(*) FROM webhook_attempts")
    rows: list[Any] = conn.execute(
        f"SELECT {_RETRY_COLUMNS} FROM webhook_attempts ORDER BY next_ms, job_id LIMIT ?",
        (limit,),
    ).fetchall()
    return int(count), [_retry(row) for row in rows]


def list_errors(conn: Conn, job_id: str) -> list[JobError]:
    rows: list[Any] = conn.execute(
        "SELECT id, at_ms, url, code, error FROM job_errors WHERE job_id = ? ORDER BY n",
        (job_id,),
    ).fetchall()
    return [
        JobError(id=i, at_ms=at, url=url, code=code, error=err) for i, at, url, code, err in rows
    ]


def has_error_code(conn: Conn, job_id: str, code: str) -> bool:
    """Whether the job has at least one error with `code`."""
    row = conn.execute(
        "SELECT 1 FROM job_errors WHERE job_id = ? AND code = ? LIMIT 1", (job_id, code)
    ).fetchone()
    return row is not None


def read_rows(
    conn: Conn, job_id: str, skip: int, limit: int, max_bytes: int
) -> tuple[list[bytes], bool]:
    """Up to `limit` stored rows (JSON bytes) after the first `skip`, stopping once they add up
    to `max_bytes` (at least one row is returned); the flag says whether more rows follow."""
    cursor = conn.execute(
        "SELECT body FROM job_rows WHERE job_id = ? ORDER BY n LIMIT ? OFFSET ?",
        (job_id, limit + 1, skip),
    )
    page: list[bytes] = []
    size = 0
    for (body,) in cursor:
        if len(page) == limit or (page and size + len(body) > max_bytes):
            return page, True
        page.append(bytes(body))
        size += len(body)
    return page, False


def read_rows_after(
    conn: Conn, job_id: str, after: int, limit: int, max_bytes: int
) -> tuple[list[tuple[int, bytes]], bool]:
    """`read_rows` by sequence instead of position: up to `limit` rows `(n, body)` numbered
    after `after` (0: from the first), in order; the flag says whether more rows follow. A
    reader that passes the last `n` it got back reads every row once, however rows commit."""
    cursor = conn.execute(
        "SELECT n, body FROM job_rows WHERE job_id = ? AND n > ? ORDER BY n LIMIT ?",
        (job_id, after, limit + 1),
    )
    page: list[tuple[int, bytes]] = []
    size = 0
    for n, body in cursor:
        if len(page) == limit or (page and size + len(body) > max_bytes):
            return page, True
        page.append((int(n), bytes(body)))
        size += len(body)
    return page, False


def resumable(conn: Conn) -> list[tuple[JobRecord, int]]:
    """Jobs with a webhook that may still have events to deliver: running ones, and finished
    ones whose stream has items after its cursor; each with that pending count."""
    rows: list[Any] = conn.execute(
        f"SELECT {_COLUMNS},"
        " (SELECT count(*) FROM outbox_items i JOIN outbox_streams s ON s.stream = i.stream"
        "   WHERE i.stream = 'webhook:' || jobs.id AND i.seq > s.ack_cursor)"
        " FROM jobs WHERE webhook IS NOT NULL"
    ).fetchall()
    found = []
    for row in rows:
        record, pending = _record(row[:-1]), row[-1]
        if not record.finished or pending:
            found.append((record, pending))
    return found


def undelivered(conn: Conn) -> dict[str, int]:
    """Job id → events after its cursor, for every job stream with any (what a drainer must
    deliver; O(1) per stream, see outbox.backlog)."""
    rows: list[Any] = conn.execute(
        "SELECT stream, last_seq - ack_cursor FROM outbox_streams"
        " WHERE stream >= ? AND stream < ? AND last_seq > ack_cursor ORDER BY stream",
        (STREAM_PREFIX, STREAM_PREFIX + "\U0010ffff"),
    ).fetchall()
    return {stream[len(STREAM_PREFIX) :]: int(n) for stream, n in rows}


def is_terminated(conn: Conn, job_id: str) -> bool:
    """Whether the job's terminal event (or final status) is committed; True when it is gone."""
    row = conn.execute("SELECT terminated FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return row is None or bool(row[0])


def expired(conn: Conn, now_ms: int, limit: int) -> list[str]:
    """Ids of finished jobs whose expiry has passed, oldest first.

    A job whose rows are still bodies of unacknowledged queue items (a collector run while the
    broker is away) is left until they are acknowledged: deleting it would lose those rows.
    """
    rows: list[Any] = conn.execute(
        "SELECT id FROM jobs WHERE status <> 'scraping' AND expires_ms <= ?"
        " AND NOT EXISTS (SELECT 1 FROM outbox_items o WHERE o.row_job = jobs.id)"
        " ORDER BY expires_ms LIMIT ?",
        (now_ms, limit),
    ).fetchall()
    return [r[0] for r in rows]


def delete_job(conn: Conn, job_id: str, chunk: int) -> bool:
    """Delete up to `chunk` of the job's rows; once none are left, the job, its errors and its
    event stream. True when the job is gone (keeps each transaction short for big jobs)."""
    conn.execute(
        "DELETE FROM job_rows WHERE job_id = ? AND n IN"
        " (SELECT n FROM job_rows WHERE job_id = ? ORDER BY n LIMIT ?)",
        (job_id, job_id, chunk),
    )
    if conn.changes() == chunk:
        return False
    drop_stream(conn, stream_name(job_id))
    conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
    return True


def list_jobs(conn: Conn, limit: int, kind: str | None = None) -> list[JobRecord]:
    """The newest jobs first (all kinds, or one), for the console's job list."""
    if kind is None:
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM jobs ORDER BY created_ms DESC, id LIMIT ?", (limit,)
        ).fetchall()
    else:
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM jobs WHERE kind = ? ORDER BY created_ms DESC, id LIMIT ?",
            (kind, limit),
        ).fetchall()
    return [_record(row) for row in rows]


def deliveries(conn: Conn, job_ids: Sequence[str]) -> dict[str, Delivery]:
    """The webhook delivery state of each of `job_ids` that has a webhook."""
    found: dict[str, Delivery] = {}
    for start in range(0, len(job_ids), 500):
        chunk = list(job_ids[start : start + 500])
        rows: list[Any] = conn.execute(
            "SELECT j.id, coalesce(s.ack_cursor, 0), coalesce(s.last_seq, 0),"
            " (SELECT count(*) FROM job_errors e WHERE e.job_id = j.id AND e.code = ?"
            "   AND (g.error_id IS NULL OR e.id <> g.error_id)),"
            " g.event_id, g.type, g.error_id, g.skipped"
            " FROM jobs j LEFT JOIN outbox_streams s ON s.stream = 'webhook:' || j.id"
            " LEFT JOIN webhook_gone g ON g.job_id = j.id"
            f" WHERE j.webhook IS NOT NULL AND j.id IN {in_list(len(chunk))}",
            (WEBHOOK_FAILED, *chunk),
        ).fetchall()
        for job_id, cursor, last, failed, event_id, type_, error_id, skipped in rows:
            gone = None
            if event_id is not None:
                gone = GoneMark(event_id=event_id, type=type_, error_id=error_id, skipped=skipped)
            found[job_id] = Delivery(
                cursor=cursor, last_seq=last, pending=max(0, last - cursor), failed=failed,
                gone=gone,
            )  # fmt: skip
    return found
