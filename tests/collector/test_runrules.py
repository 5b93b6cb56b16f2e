"""What becomes of a collector run's job (daemon/collector/runrules.py), with plain values: only a
user or the configuration ends a job `cancelled`, and its error says which; every other way a run
is cut short leaves the job running for whoever runs the task next."""

from __future__ import annotations

import apsw
import psycopg
import pytest
import trio

from daemon.cluster import LeaseLost
from daemon.collector import runrules
from daemon.collector.runrules import ended_by, job_outcome, on_start, retry_in_s
from daemon.jobs.store import JobFinished, JobNotFound
from daemon.store import StoreClosed, StoreUnavailable


def cancelled() -> trio.Cancelled:
    return trio.Cancelled._create(source="explicit")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("exc", "removed", "lease_lost", "status", "says"),
    [
        (cancelled(), None, False, "interrupted", "shutdown"),
        (cancelled(), None, True, "interrupted", "lost the task's lease"),
        (cancelled(), runrules.TASK_REMOVED, False, "removed", "removed from the configuration"),
        (cancelled(), runrules.TASK_DISABLED, True, "removed", "disabled in the configuration"),
        (LeaseLost("collector:t1"), None, True, "interrupted", "another instance"),
        (psycopg.OperationalError("server closed the connection"), None, False, "interrupted",
         "OperationalError: server closed"),
        (apsw.IOError("disk I/O error"), None, False, "interrupted", "the store failed"),
        (psycopg.OperationalError("couldn't get a connection"), None, True, "interrupted",
         "lost the task's lease (the database unreachable past the lease"),
        (StoreUnavailable("postgres: cannot connect"), None, False, "interrupted", "cannot connect"),
        (StoreClosed("closed"), None, False, "interrupted", "shutdown"),
        (JobFinished("j", "cancelled"), None, False, "ended", "final status elsewhere"),
        (JobNotFound("j"), None, False, "ended", "final status elsewhere"),
        (ValueError("upstream said no"), None, False, "failed", "ValueError: upstream said no"),
        (BaseExceptionGroup("nursery", [cancelled(), LeaseLost("x")]), None, False,
         "interrupted", "another instance"),
        (BaseExceptionGroup("nursery", [cancelled(), BaseExceptionGroup("inner", [cancelled()])]),
         None, False, "interrupted", "shutdown"),
    ],
)  # fmt: skip
def test_how_a_run_ended(
    exc: BaseException, removed: str | None, lease_lost: bool, status: str, says: str
) -> None:
    got_status, why = ended_by(exc, removed=removed, lease_lost=lease_lost)
    assert got_status == status
    assert says in why


@pytest.mark.parametrize(
    ("status", "error", "outcome"),
    [
        ("completed", None, ("completed", None)),
        ("failed", "OctoparseError: no permission", ("failed", "OctoparseError: no permission")),
        ("stopped", None, ("cancelled", "stopped by a user (POST /crawl/stop)")),
        ("cancelled", None, ("cancelled", "cancelled by a user (DELETE /v2/crawl/{id})")),
        ("removed", runrules.COLLECTOR_DISABLED,
         ("cancelled", "the collector was disabled in the configuration (reload)")),
        ("interrupted", runrules.SHUTDOWN, None),  # the job goes on
        ("interrupted", runrules.LEASE_EXPIRED, None),
        ("ended", runrules.JOB_ENDED, None),  # it has its final status already
    ],
)  # fmt: skip
def test_what_the_job_becomes(
    status: str, error: str | None, outcome: tuple[str, str | None] | None
) -> None:
    assert job_outcome(status, error) == outcome


def test_only_a_user_or_the_configuration_cancels_a_job() -> None:
    ends = ["completed", "failed", "stopped", "cancelled", "removed", "interrupted", "ended"]
    cancelling = {s for s in ends if (job_outcome(s, "x") or ("", ""))[0] == "cancelled"}
    assert cancelling == {"stopped", "cancelled", "removed"}


def test_a_running_status_is_not_an_end() -> None:
    with pytest.raises(ValueError, match="not an end"):
        job_outcome("running", None)


@pytest.mark.parametrize(
    ("job_running", "range_done", "last_cut_short", "plan"),
    [
        (False, False, True, "none"),  # a user cancelled it meanwhile: nothing to continue
        (False, True, True, "none"),
        (True, False, True, "continue"),  # killed, paused or shut down mid-range
        (True, False, False, "continue"),
        (True, True, True, "complete"),  # every window committed, the end not recorded
        (True, True, False, "continue"),  # opened for a run that died before its first save
    ],
)
def test_what_a_starting_crawler_does_with_the_job_left_running(
    job_running: bool, range_done: bool, last_cut_short: bool, plan: str
) -> None:
    got = on_start(job_running=job_running, range_done=range_done, last_cut_short=last_cut_short)
    assert got == plan


def test_retries_after_a_store_failure_back_off_to_ten_seconds() -> None:
    assert [retry_in_s(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert retry_in_s(0) == 0.5


def test_cut_short_runs_are_resumed_at_once_by_the_next_owner() -> None:
    assert runrules.cut_short("interrupted") and runrules.cut_short("removed")
    assert not any(runrules.cut_short(s) for s in ("completed", "failed", "stopped", "cancelled"))
