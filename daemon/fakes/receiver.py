# A webhook receiver for tests, the demo and benchmarks: a real HTTP server (Starlette under
# hypercorn, like every server in the project) so delivery is exercised through real sockets,
# real timeouts and real connection failures rather than a mocked transport.
#
# It records every request exactly as it arrived (raw body bytes, headers, time), checks
# signatures with daemon/jobs/verify.py (the helper users copy), and keeps the per-job promises
# of the spec as running checks, so a test asks "were there violations?" instead of re-deriving
# them: seq never goes backwards within a job, nothing follows the terminal event, and a resent
# eventId carries the same webhookId and the same bytes. Gaps are not violations (a
# dead-lettered event may never have reached the receiver) and are reported separately.
#
# Faults are a script consumed one request at a time (fail the next N with a status, delay the
# next N), plus "die": the server stops listening and drops open connections, then comes back
# on the same port. The same controls exist in Python (WebhookReceiver) and as JSON endpoints
# under /_receiver/ for a receiver run as `python -m daemon.fakes.receiver --bind HOST:PORT`.
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from daemon.api.errors import (
    HTTPError,
    JSONResponse,
    decode_query_int,
    handle_http_error,
    read_json_body,
)
from daemon.api.server import serve_app
from daemon.jobs.verify import WebhookVerificationError, verify
from daemon.logs import get_logger, setup_logging

log = get_logger("fakes.receiver")

TERMINAL_SUFFIXES = (".completed", ".failed")


@dataclass
class Received:
    """One request as it arrived, and what the receiver answered."""

    index: int
    method: str
    path: str
    headers: dict[str, str]
    """Lower-cased names; the last value wins for repeated headers."""
    body: bytes
    json: Any
    arrived: float
    """Wall-clock Unix seconds."""
    signature_error: str | None = None
    """Why verification failed; None when it passed or no secret is configured."""
    status: int | None = None
    """The status answered; None while the answer is pending or when the server died first."""

    @property
    def event(self) -> dict[str, Any]:
        return self.json if isinstance(self.json, dict) else {}

    @property
    def job_id(self) -> str | None:
        value = self.event.get("id")
        return value if isinstance(value, str) else None

    @property
    def seq(self) -> int | None:
        value = self.event.get("seq")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def type(self) -> str | None:
        value = self.event.get("type")
        return value if isinstance(value, str) else None

    @property
    def event_id(self) -> str | None:
        value = self.event.get("eventId")
        return value if isinstance(value, str) else None

    @property
    def webhook_id(self) -> str | None:
        value = self.event.get("webhookId")
        return value if isinstance(value, str) else None

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "method": self.method,
            "path": self.path,
            "arrived": self.arrived,
            "status": self.status,
            "headers": self.headers,
            "body": self.body.decode("utf-8", "replace"),
            "signatureError": self.signature_error,
        }


@dataclass
class _Action:
    status: int = 200
    delay: float = 0.0
    retry_after: str | None = None


@dataclass
class _JobTrack:
    max_seq: int = 0
    terminal_seq: int | None = None
    delivered: set[int] = field(default_factory=set)
    seen: dict[str, tuple[str | None, bytes]] = field(default_factory=dict)
    gaps: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class _Server:
    scope: trio.CancelScope
    done: trio.Event


class FailRequest(msgspec.Struct, forbid_unknown_fields=True):
    count: int = 1
    status: int = 500
    retry_after: str | int | None = None
    delay: float = 0.0


class DelayRequest(msgspec.Struct, forbid_unknown_fields=True):
    seconds: float
    count: int = 1
    status: int = 200


class DieRequest(msgspec.Struct, forbid_unknown_fields=True):
    seconds: float


def _hold_port(host: str, port: int) -> socket.socket | None:
    """A socket bound to (host, port) that does not listen: connections to the port are
    refused, and the port is not handed to another socket binding port 0."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        return None
    return sock


class WebhookReceiver:
    """A recording webhook endpoint with scripted faults.

    Start it with `await nursery.start(receiver.run)` (reports (host, port)) or
    `async with open_receiver(...) as receiver`. Post events to `receiver.url()`.
    """

    def __init__(
        self,
        *,
        bind: str = "127.0.0.1:0",
        secret: str | None = None,
        tolerance: float = 300.0,
        reject_bad_signatures: bool = False,
        clock: Callable[[], float] = time.time,
        log_events: bool = False,
    ) -> None:
        self.bind = bind
        self.secret = secret
        self.tolerance = tolerance
        self.reject_bad_signatures = reject_bad_signatures
        self.log_events = log_events
        self._clock = clock
        self.host = ""
        self.port = 0
        self.requests: list[Received] = []
        self.violations: list[str] = []
        self.duplicates: list[str] = []
        self._jobs: dict[str, _JobTrack] = {}
        self._script: deque[_Action] = deque()
        self._changed = trio.Event()
        self._stop = trio.Event()
        self._server: _Server | None = None
        self._placeholder: socket.socket | None = None
        self._nursery: trio.Nursery | None = None
        self.app = self._build_app()

    # -- lifecycle -------------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until `stop()`; `task_status.started((host, port))` once bound."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.host, self.port = await nursery.start(self._serve, self.bind)
                task_status.started((self.host, self.port))
                await self._stop.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            self._server = None
            self._release_port()
            self._touch()

    def stop(self) -> None:
        self._stop.set()

    @property
    def alive(self) -> bool:
        return self._server is not None

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def url(self, path: str = "/hook") -> str:
        return f"http://{self.netloc}{path}"

    async def die(self) -> None:
        """Stop listening and drop every open connection (in-flight requests get no answer).
        The port stays bound without listening (a connection is refused) until `revive`, so
        no other server started meanwhile on this machine takes it."""
        server, self._server = self._server, None
        if server is not None:
            server.scope.cancel()
            await server.done.wait()
            self._placeholder = _hold_port(self.host, self.port)

    async def revive(self) -> None:
        """Listen again on the same host and port."""
        if self._nursery is None:
            raise RuntimeError("the receiver is not running")
        if self._server is None:
            self._release_port()
            await self._nursery.start(self._serve, self.netloc)
            self._touch()

    def _release_port(self) -> None:
        placeholder, self._placeholder = self._placeholder, None
        if placeholder is not None:
            placeholder.close()

    async def die_for(self, seconds: float) -> None:
        await self.die()
        await trio.sleep(seconds)
        await self.revive()

    async def _serve(self, bind: str, *, task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        server = _Server(trio.CancelScope(), trio.Event())
        self._server = server
        try:
            with server.scope:
                await serve_app(
                    self.app, bind, graceful_timeout=0.1, name="receiver", task_status=task_status
                )
        finally:
            server.done.set()
            if self._server is server:
                self._server = None
            self._touch()

    # -- faults ----------------------------------------------------------------------------

    def fail_next(
        self,
        count: int = 1,
        status: int = 500,
        *,
        retry_after: str | int | None = None,
        delay: float = 0.0,
    ) -> None:
        """Answer the next `count` requests with `status` (and `Retry-After`, if given)."""
        after = None if retry_after is None else str(retry_after)
        self._script.extend(_Action(status, delay, after) for _ in range(count))

    def delay_next(self, count: int = 1, seconds: float = 1.0, status: int = 200) -> None:
        """Hold the answer to the next `count` requests for `seconds`."""
        self._script.extend(_Action(status, seconds) for _ in range(count))

    def clear_faults(self) -> None:
        self._script.clear()

    def reset(self) -> None:
        """Forget every request, fault and check."""
        self.requests.clear()
        self.violations.clear()
        self.duplicates.clear()
        self._jobs.clear()
        self._script.clear()
        self._touch()

    # -- what arrived ----------------------------------------------------------------------

    def events(self, job_id: str | None = None, *, delivered: bool = True) -> list[Received]:
        """Requests carrying an event (of `job_id`), by default only those answered 2xx."""
        return [
            r
            for r in self.requests
            if r.seq is not None
            and (job_id is None or r.job_id == job_id)
            and (r.delivered or not delivered)
        ]

    def seqs(self, job_id: str, *, delivered: bool = True) -> list[int]:
        return [r.seq for r in self.events(job_id, delivered=delivered) if r.seq is not None]

    def gaps(self, job_id: str) -> list[tuple[int, int]]:
        """(after, before) pairs of seqs between which nothing arrived for `job_id`."""
        track = self._jobs.get(job_id)
        return list(track.gaps) if track else []

    @property
    def signature_failures(self) -> list[Received]:
        return [r for r in self.requests if r.signature_error is not None]

    def check(self) -> None:
        """Raise AssertionError listing order violations and signature failures, if any."""
        problems = list(self.violations)
        problems += [f"request {r.index}: {r.signature_error}" for r in self.signature_failures]
        if problems:
            raise AssertionError("webhook receiver saw problems:\n" + "\n".join(problems))

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once `predicate()` holds; re-checked after every request or answer."""
        while True:
            changed = self._changed
            if predicate():
                return
            await changed.wait()

    async def wait_delivered(self, count: int, job_id: str | None = None) -> list[Received]:
        """Wait for `count` delivered events (of `job_id`); returns them."""
        await self.wait_until(lambda: len(self.events(job_id)) >= count)
        return self.events(job_id)

    def summary(self) -> dict[str, Any]:
        return {
            "alive": self.alive,
            "total": len(self.requests),
            "delivered": sum(r.delivered for r in self.requests),
            "pendingFaults": len(self._script),
            "violations": self.violations,
            "duplicates": self.duplicates,
            "signatureFailures": len(self.signature_failures),
            "jobs": {
                job: {
                    "maxSeq": t.max_seq,
                    "delivered": len(t.delivered),
                    "terminalSeq": t.terminal_seq,
                    "gaps": t.gaps,
                }
                for job, t in self._jobs.items()
            },
        }

    # -- request handling ------------------------------------------------------------------

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _check_order(self, rec: Received) -> None:
        job, seq, event_id = rec.job_id, rec.seq, rec.event_id
        if job is None or seq is None:
            self.violations.append(f"request {rec.index}: body has no job id or seq")
            return
        track = self._jobs.setdefault(job, _JobTrack())
        where = f"job {job} seq {seq}"
        if event_id != f"{job}:{seq}":
            self.violations.append(f"{where}: eventId {event_id!r} does not match")
        if seq < track.max_seq:
            self.violations.append(f"{where}: arrived after seq {track.max_seq}")
        if track.terminal_seq is not None and seq > track.terminal_seq:
            self.violations.append(f"{where}: arrived after the terminal seq {track.terminal_seq}")
        if event_id is not None:
            first = track.seen.setdefault(event_id, (rec.webhook_id, rec.body))
            if first[0] != rec.webhook_id:
                self.violations.append(f"{where}: webhookId changed on resend")
            elif first[1] != rec.body:
                self.violations.append(f"{where}: body changed on resend")
        if seq > track.max_seq + 1:
            track.gaps.append((track.max_seq, seq))
        track.max_seq = max(track.max_seq, seq)
        if rec.type is not None and rec.type.endswith(TERMINAL_SUFFIXES):
            if track.terminal_seq is not None and track.terminal_seq != seq:
                self.violations.append(f"{where}: second terminal event")
            track.terminal_seq = seq

    def _record_answer(self, rec: Received, status: int) -> None:
        rec.status = status
        job, seq = rec.job_id, rec.seq
        if rec.delivered and job is not None and seq is not None:
            track = self._jobs.setdefault(job, _JobTrack())
            if seq in track.delivered:
                self.duplicates.append(f"{job}:{seq}")
            track.delivered.add(seq)
        if self.log_events:
            log.info(
                "webhook",
                type=rec.type,
                job=job,
                seq=seq,
                status=status,
                signature="-" if self.secret is None else (rec.signature_error or "ok"),
                bytes=len(rec.body),
            )
        self._touch()

    async def _hook(self, request: Request) -> Response:
        body = await request.body()
        try:
            parsed = msgspec.json.decode(body) if body else None
        except msgspec.DecodeError:
            parsed = None
        rec = Received(
            index=len(self.requests),
            method=request.method,
            path=request.url.path,
            headers={k.decode("latin-1"): v.decode("latin-1") for k, v in request.headers.raw},
            body=body,
            json=parsed,
            arrived=self._clock(),
        )
        if self.secret is not None:
            try:
                verify(
                    self.secret,
                    body,
                    request.headers,
                    tolerance=self.tolerance,
                    now=rec.arrived,
                    require_timestamped=True,
                )
            except WebhookVerificationError as exc:
                rec.signature_error = str(exc)
        self.requests.append(rec)
        if rec.seq is not None or rec.job_id is not None:
            self._check_order(rec)
        self._touch()
        action = self._script.popleft() if self._script else _Action()
        if action.delay > 0:
            await trio.sleep(action.delay)
        status = action.status
        if self.reject_bad_signatures and rec.signature_error is not None:
            status = 401
        headers = {"Retry-After": action.retry_after} if action.retry_after is not None else {}
        self._record_answer(rec, status)
        return JSONResponse({"ok": 200 <= status < 300}, status_code=status, headers=headers)

    async def _requests(self, request: Request) -> Response:
        job = request.query_params.get("job")
        offset = decode_query_int(request, "offset", 0, 0, 10**9)
        limit = decode_query_int(request, "limit", 100, 1, 10_000)
        chosen = [r for r in self.requests if job is None or r.job_id == job]
        page = [r.to_json() for r in chosen[offset : offset + limit]]
        return JSONResponse({"total": len(chosen), "requests": page})

    async def _summary(self, request: Request) -> Response:
        return JSONResponse(self.summary())

    async def _fail(self, request: Request) -> Response:
        spec = await read_json_body(request, FailRequest)
        if not 1 <= spec.count <= 1_000_000 or not 100 <= spec.status <= 599:
            raise HTTPError(422, "count must be 1..1000000 and status 100..599")
        self.fail_next(spec.count, spec.status, retry_after=spec.retry_after, delay=spec.delay)
        return JSONResponse(self.summary())

    async def _delay(self, request: Request) -> Response:
        spec = await read_json_body(request, DelayRequest, empty_ok=False)
        if not 1 <= spec.count <= 1_000_000 or not 0 <= spec.seconds <= 3600:
            raise HTTPError(422, "count must be 1..1000000 and seconds 0..3600")
        self.delay_next(spec.count, spec.seconds, spec.status)
        return JSONResponse(self.summary())

    async def _die(self, request: Request) -> Response:
        spec = await read_json_body(request, DieRequest, empty_ok=False)
        if not 0 < spec.seconds <= 3600:
            raise HTTPError(422, "seconds must be in (0, 3600]")
        nursery = self._nursery
        assert nursery is not None

        async def after_answer() -> None:
            # The receiver's own nursery outlives the server that die_for stops.
            nursery.start_soon(self.die_for, spec.seconds)

        task = BackgroundTask(after_answer)
        return JSONResponse({"dying": True, "seconds": spec.seconds}, background=task)

    async def _reset(self, request: Request) -> Response:
        self.reset()
        return JSONResponse(self.summary())

    def _build_app(self) -> Starlette:
        routes = [
            Route("/_receiver/requests", self._requests, methods=["GET"]),
            Route("/_receiver/summary", self._summary, methods=["GET"]),
            Route("/_receiver/fail", self._fail, methods=["POST"]),
            Route("/_receiver/delay", self._delay, methods=["POST"]),
            Route("/_receiver/die", self._die, methods=["POST"]),
            Route("/_receiver/reset", self._reset, methods=["POST"]),
            Route("/{path:path}", self._hook, methods=["POST", "PUT"]),
        ]
        return Starlette(routes=routes, exception_handlers={HTTPError: handle_http_error})


@asynccontextmanager
async def open_receiver(**options: Any) -> AsyncIterator[WebhookReceiver]:
    """A running WebhookReceiver (options as for its constructor), stopped on exit."""
    receiver = WebhookReceiver(**options)
    async with trio.open_nursery() as nursery:
        await nursery.start(receiver.run)
        try:
            yield receiver
        finally:
            receiver.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m daemon.fakes.receiver",
        description="A webhook receiver that logs each event on one line (controls: /_receiver/).",
    )
    parser.add_argument("--bind", default="127.0.0.1:8702", help="host:port (default %(default)s)")
    parser.add_argument(
        "--secret-env", help="environment variable holding the signing secret to verify with"
    )
    parser.add_argument(
        "--reject-bad-signatures", action="store_true", help="answer 401 when verification fails"
    )
    args = parser.parse_args(argv)
    secret = None
    if args.secret_env:
        secret = os.environ.get(args.secret_env)
        if secret is None:
            parser.error(f"environment variable {args.secret_env} is not set")
    setup_logging("info")
    receiver = WebhookReceiver(
        bind=args.bind,
        secret=secret,
        reject_bad_signatures=args.reject_bad_signatures,
        log_events=True,
    )

    async def serve() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                host, port = await nursery.start(receiver.run)
                log.info("listening", url=f"http://{host}:{port}/hook", controls="/_receiver/")
                async for _ in signals:
                    receiver.stop()
                    break

    trio.run(serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
