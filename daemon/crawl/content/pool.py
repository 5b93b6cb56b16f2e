# Worker processes for the CPU work of pages (issue 36): turning a page into a document is pure
# Python glue around selectolax and html-to-markdown, which holds the GIL most of the time
# (measured: threads do not add throughput), so the trio thread, busy with HTTP, the store and
# the crawl's bookkeeping, hands it to processes instead.
#
# Shaped for a daemon rather than a batch job:
#   - one request at a time per worker, over a socket pair the trio side reads with FdStream,
#     so waiting for an answer costs no thread; callers beyond the pool's size wait on a trio
#     semaphore (the bound: at most `size` pages in the workers, the others wait in trio);
#   - a worker that dies (a parser crash, the OOM killer, a kill) costs the page it was running:
#     its caller gets WorkerLost, the worker is dropped and a new one starts on the next call;
#   - a caller cancelled mid-page kills its worker (its answer would come to nobody, and a page
#     stuck in a parser must not hold the worker), so cancelling never leaks a busy process;
#   - workers start lazily from a forkserver that has imported the document code, so a daemon
#     that never crawls has none, and each start is a fork, not an interpreter start;
#   - a worker whose parent is gone reads end-of-file and exits;
#   - workers run under SCHED_BATCH: woken by a request, they do not preempt the trio thread
#     that sent it (on a busy 2-core box a write to a worker otherwise often cost a context
#     switch of the event loop).
# concurrent.futures.ProcessPoolExecutor was not used: one dead worker breaks the whole executor
# and fails every page in it.
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import pickle
import signal
import struct
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import trio

__all__ = ["PagePool", "WorkerLost", "pool_size"]

T = TypeVar("T")

TRIM_BYTES = 128 * 1024
"""After a request this big, the worker gives freed C heap back to the system (malloc_trim):
a multi-megabyte page takes a hundred MB for a moment that glibc would otherwise keep."""
READ_BYTES = 256 * 1024
"""Most bytes asked of the socket at once while no answer size is known."""
JOIN_S = 5.0
"""How long a closing worker has to exit before it is killed."""

_SMALL = struct.Struct("!i")
_LARGE = struct.Struct("!Q")


class WorkerLost(Exception):
    """The worker process running the call ended before answering (it crashed or was killed)."""


_LOST = (WorkerLost, trio.BrokenResourceError, trio.ClosedResourceError, OSError)
"""How a worker's death shows on its socket: end-of-file, a reset, a broken pipe, or the socket
closed under the call by `aclose`."""


def pool_size(configured: int | str) -> int:
    """Workers for `[crawl] content_workers`: "auto" is the cores this process may use."""
    if configured == "auto":
        return len(os.sched_getaffinity(0))
    return int(configured)


def _frame(data: bytes) -> bytes:
    """`data` framed as multiprocessing.Connection.send_bytes frames it."""
    if len(data) > 0x7FFFFFFF:
        return _SMALL.pack(-1) + _LARGE.pack(len(data)) + data
    return _SMALL.pack(len(data)) + data


def _trim() -> Callable[[], object]:
    """glibc's malloc_trim(0); a no-op elsewhere."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    return lambda: trim(0)


def batch() -> None:
    """Linux's SCHED_BATCH for this process: a worker woken by a request does not preempt the
    trio thread that sent it (which has the rest of the crawl to run), it takes its turn."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def serve(conn: Connection) -> None:
    """A worker's loop: unpickle (fn, args), answer (True, result) or (False, exception)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon decides when its workers end
    batch()
    trim = _trim()
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            fn, args = pickle.loads(request)
            answer: tuple[bool, Any] = (True, fn(*args))
        except Exception as exc:  # the caller gets it, as if the call had run inline
            answer = (False, exc)
        conn.send_bytes(_answer(answer))
        if len(request) > TRIM_BYTES:
            trim()


def _answer(answer: tuple[bool, Any]) -> bytes:
    """The pickled answer; a RuntimeError naming it when it would not pickle, or (an exception
    whose __init__ does not take its args) would not unpickle in the caller."""
    try:
        data = pickle.dumps(answer, pickle.HIGHEST_PROTOCOL)
        if not answer[0]:
            pickle.loads(data)
        return data
    except Exception as exc:
        failure = RuntimeError(f"unpicklable answer: {type(exc).__name__}: {exc}; {answer[1]!r}")
        return pickle.dumps((False, failure), pickle.HIGHEST_PROTOCOL)


class _Worker:
    """One worker process and the trio side of its socket."""

    def __init__(self, process: Any, stream: trio.lowlevel.FdStream) -> None:
        self.process = process
        self.stream = stream

    async def call(self, request: bytes) -> bytes:
        await self.stream.send_all(request)
        # The worker sends one answer per request, so whatever arrives belongs to it: read
        # greedily (one read for most answers) rather than header and body apart.
        data = await self._more(b"", _SMALL.size)
        (size,) = _SMALL.unpack_from(data)
        start = _SMALL.size
        if size == -1:
            data = await self._more(data, start + _LARGE.size)
            (size,) = _LARGE.unpack_from(data, start)
            start += _LARGE.size
        data = await self._more(data, start + size)
        return data[start:]

    async def _more(self, data: bytes, n: int) -> bytes:
        """`data` with what follows it on the socket, until it is `n` bytes long."""
        chunks = [data]
        have = len(data)
        while have < n:
            chunk = await self.stream.receive_some(max(n - have, READ_BYTES))
            if not chunk:
                raise WorkerLost("the content worker ended before answering")
            chunks.append(chunk)
            have += len(chunk)
        return b"".join(chunks) if len(chunks) > 1 else data

    def kill(self) -> None:
        """End the process now (its answer, if any, is dropped)."""
        self.stream.close()
        if self.process.is_alive():
            self.process.kill()

    def end(self) -> None:
        """Blocking, once its stream is closed: let the process see end-of-file and exit, or
        kill it after JOIN_S."""
        self.process.join(JOIN_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(JOIN_S)


class PagePool:
    """`size` worker processes running picklable module-level functions for trio callers."""

    def __init__(self, size: int, preload: tuple[str, ...] = ()) -> None:
        if size < 1:
            raise ValueError("a pool needs at least one worker")
        self.size = size
        self._ctx = multiprocessing.get_context("forkserver")
        if preload:
            self._ctx.set_forkserver_preload(list(preload))
        self._slots = trio.Semaphore(size)
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._closed = False
        self.counts: dict[str, int] = {"calls": 0, "started": 0, "lost": 0, "killed": 0}

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker; its exception if it raised one; WorkerLost if the worker
        died meanwhile. `fn` and `args` must pickle (a module-level function, plain values)."""
        request = _frame(pickle.dumps((fn, args), pickle.HIGHEST_PROTOCOL))
        async with self._slots:
            if self._closed:
                raise WorkerLost("the content workers are shut down")
            worker = self._idle.pop() if self._idle else await self._start()
            try:
                answer = await worker.call(request)
            except BaseException as exc:
                lost = isinstance(exc, _LOST)
                self._drop(worker, lost=lost)
                if lost and not isinstance(exc, WorkerLost):
                    raise WorkerLost(f"the content worker ended: {exc!r}") from None
                raise
            self._idle.append(worker)
        self.counts["calls"] += 1
        ok, value = pickle.loads(answer)
        if not ok:
            raise value
        return value

    async def _start(self) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=serve, args=(child,), name="crawld-content", daemon=True)
        try:
            await trio.to_thread.run_sync(process.start)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        fd = os.dup(parent.fileno())
        parent.close()
        worker = _Worker(process, trio.lowlevel.FdStream(fd))
        self._all.add(worker)
        self.counts["started"] += 1
        return worker

    def _drop(self, worker: _Worker, *, lost: bool) -> None:
        if worker in self._all:
            self.counts["lost" if lost else "killed"] += 1
            self._all.discard(worker)
        worker.kill()

    def status(self) -> dict[str, int]:
        """Size, processes running, pages in them and waiting for one, and the counts."""
        return {
            "size": self.size,
            "processes": len(self._all),
            "busy": len(self._all) - len(self._idle),
            "waiting": self._slots.statistics().tasks_waiting,
            **self.counts,
        }

    async def aclose(self) -> None:
        """End every worker (busy ones are killed: their callers are being cancelled)."""
        self._closed = True
        busy = self._all - set(self._idle)
        for worker in busy:
            self._drop(worker, lost=False)
        idle, self._idle, self._all = self._idle, [], set()
        for worker in idle:
            worker.stream.close()
        with trio.CancelScope(shield=True):
            for worker in [*idle, *busy]:
                await trio.to_thread.run_sync(worker.end)
