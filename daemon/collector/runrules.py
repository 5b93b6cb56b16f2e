# What becomes of a collector run's job: how a run ended (from the exception that ended it, or
# the stop it heard), what final status its job gets, and what a crawler does at start with the
# job its task's row still points to. Pure: plain values in, decisions out, tested with tables.
#
# The promise to the user holding a job id: a job ends `cancelled` only because somebody asked
# (a user's POST /crawl/stop or DELETE /v2/crawl/{id}, the task removed from the configuration),
# and its error says who. Anything else that cuts a run short (a shutdown, a reload restarting
# the task, the database unreachable, the task's lease lost to a pause or a kill) leaves the job
# running: whoever runs the task next (another instance, this one once the database answers, the
# next start) continues the SAME job from the last committed window, and its webhook stream
# goes on with the next seq.
from __future__ import annotations

from typing import Literal

import trio

from daemon.cluster import LeaseLost
from daemon.jobs.events import CANCELLED_BY_USER
from daemon.jobs.store import JobFinished, JobNotFound
from daemon.store import DB_ERRORS, StoreClosed, StoreUnavailable
from daemon.supervise import describe

RunStatus = Literal[
    "running", "completed", "failed", "stopped", "cancelled", "removed", "interrupted", "ended"
]
"""`stopped`: POST /crawl/stop; `cancelled`: DELETE of its job; `removed`: the task removed or
disabled by a reload; `interrupted`: cut short by anything else (its job continues); `ended`:
its job was given a final status by another process (nothing more to give it)."""

FinalStatus = Literal["completed", "failed", "cancelled"]
StartPlan = Literal["continue", "complete", "none"]

STOPPED_BY_USER = "stopped by a user (POST /crawl/stop)"
TASK_REMOVED = "the task was removed from the configuration (reload)"
TASK_DISABLED = "the task was disabled in the configuration (reload)"
COLLECTOR_DISABLED = "the collector was disabled in the configuration (reload)"
SHUTDOWN = (
    "the crawler stopped (shutdown, or a reload changing the task); the job continues at the next"
    " start"
)
LEASE_EXPIRED = (
    "this instance lost the task's lease (the database unreachable past the lease, or the process"
    " paused); whoever takes the task next continues the job"
)
TAKEN_OVER = "another instance took the task over; it continues the job"
JOB_ENDED = "the run's job was given a final status elsewhere (cancelled, or expired)"


def store_failed(exc: BaseException) -> str:
    return f"the store failed ({describe(exc)}); the run continues once it answers"


def leaf(exc: BaseException) -> BaseException:
    """The exception that tells how a run ended, out of a (nested) group: the first that is
    not a cancellation, else the first cancellation."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    leaves = [leaf(e) for e in exc.exceptions]
    return next((e for e in leaves if not isinstance(e, trio.Cancelled)), leaves[0])


def ended_by(exc: BaseException, *, removed: str | None, lease_lost: bool) -> tuple[RunStatus, str]:
    """How a run that raised `exc` ended, and why (the run's error text).

    `removed`: set when the crawler was stopped because the configuration no longer lists the
    task (the reason, one of TASK_REMOVED, TASK_DISABLED, COLLECTOR_DISABLED); `lease_lost`:
    the task's lease was lost while the run was going."""
    exc = leaf(exc)
    if isinstance(exc, trio.Cancelled):
        if removed is not None:
            return "removed", removed
        return "interrupted", LEASE_EXPIRED if lease_lost else SHUTDOWN
    if isinstance(exc, LeaseLost):
        return "interrupted", TAKEN_OVER
    if isinstance(exc, JobFinished | JobNotFound):
        return "ended", JOB_ENDED
    if isinstance(exc, StoreClosed):
        return "interrupted", SHUTDOWN
    if isinstance(exc, (*DB_ERRORS, StoreUnavailable)):
        if lease_lost:
            # A store call that outlasted the lease (a pool waiting out a cut): the lease is what
            # ends this instance's run, the failure is why.
            return "interrupted", f"{LEASE_EXPIRED}; its last store call failed ({describe(exc)})"
        return "interrupted", store_failed(exc)
    return "failed", describe(exc)


def job_outcome(status: str, error: str | None) -> tuple[FinalStatus, str | None] | None:
    """The final status and error to give a run's job once the run ended with `status`, or None:
    the job stays running (`interrupted`: whoever runs the task next continues it) or already
    has its final status (`ended`)."""
    if status == "completed":
        return "completed", None
    if status == "failed":
        return "failed", error or "failed"
    if status == "stopped":
        return "cancelled", STOPPED_BY_USER
    if status == "cancelled":
        return "cancelled", CANCELLED_BY_USER
    if status == "removed":
        return "cancelled", error or TASK_REMOVED
    if status in ("interrupted", "ended"):
        return None
    raise ValueError(f"run status {status!r} is not an end")


def cut_short(status: str) -> bool:
    """Whether a run that ended with `status` was cut short by its instance (or configuration)
    rather than ended by itself or a user: its unfinished range is resumed at once by the next
    owner."""
    return status in ("interrupted", "removed")


def on_start(*, job_running: bool, range_done: bool, last_cut_short: bool) -> StartPlan:
    """What a crawler starting on a task does with the job the task's row points to.

    `job_running`: the job is still running in the store (nobody gave it a final status);
    `range_done`: the stored progress has every window of its range committed; `last_cut_short`:
    the run that saved that progress did not record its own end (killed) or was cut short.

    - `continue`: run at once under that job, from the stored progress;
    - `complete`: every window of the job's run was committed, only the bookkeeping was lost:
      give the job `completed` now;
    - `none`: the job has its final status; nothing to do for it."""
    if not job_running:
        return "none"
    if range_done and last_cut_short:
        return "complete"
    # range_done without a cut-short run: the job was opened for a new run that died before it
    # saved its first progress; running it now does that run.
    return "continue"


def retry_in_s(attempt: int) -> float:
    """How long a crawler waits before continuing a run the store failed under (its lease still
    held), after `attempt` such failures in a row: 0.5 s doubling, at most 10 s."""
    return float(min(10.0, 0.5 * 2 ** max(0, attempt - 1)))
