# systemd's notify protocol is one AF_UNIX datagram of `KEY=VALUE` lines sent to $NOTIFY_SOCKET,
# so it is spoken here in pure Python rather than through libsystemd bindings (which need headers
# to build and last shipped in 2023). Each message opens a fresh non-blocking socket and sends with
# MSG_DONTWAIT, as libsystemd's sd_notify does: a send to a unix datagram socket never waits on the
# network, so doing it synchronously on the trio thread is fine, and a full or vanished receiver
# costs one debug line instead of a stalled loop. A notifier never raises: telling systemd how we
# are is advisory, and the daemon must run the same with or without it (no $NOTIFY_SOCKET = no-op).
#
# RELOADING=1 carries MONOTONIC_USEC in the same datagram because systemd's notify-reload (>= 253)
# ignores, or hangs on, a RELOADING=1 without it. The watchdog is pinged by a task on the trio
# loop itself, so a loop that stops scheduling tasks stops the pings and systemd restarts us.
from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

import trio

from daemon.logs import get_logger

log = get_logger("systemd")

# systemd reads notifications into a PIPE_BUF-sized buffer and drops longer datagrams whole, so a
# STATUS= line is cut well below that.
_STATUS_MAX_BYTES = 1024


class Notifier:
    """Sends sd_notify messages; every method is a no-op when no socket address is known.

    `address` is a $NOTIFY_SOCKET value (a path, or `@name` for an abstract socket). When it is
    omitted it is read from `environ` (default `os.environ`).
    """

    def __init__(self, address: str | None = None, *, environ: Mapping[str, str] | None = None):
        if address is None:
            address = (os.environ if environ is None else environ).get("NOTIFY_SOCKET") or None
        self.address = address
        self._sockaddr: str | bytes | None = None
        if address is not None:
            # A leading "@" names a Linux abstract socket: the address starts with a NUL byte.
            self._sockaddr = b"\0" + address[1:].encode() if address.startswith("@") else address

    @property
    def enabled(self) -> bool:
        return self._sockaddr is not None

    def notify(self, *fields: str) -> bool:
        """Send `fields` ("KEY=VALUE") as one datagram; True if it was sent."""
        if self._sockaddr is None:
            return False
        payload = "\n".join(fields).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                sock.sendto(payload, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL, self._sockaddr)
        except OSError as exc:
            log.debug("sd_notify failed", socket=self.address, message=fields[0], error=exc)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """Start-up (or a reload) is complete."""
        return self.notify("READY=1", *_status_field(status))

    def reloading(self, status: str | None = None) -> bool:
        """A reload has begun; follow it with `ready()` whether or not it succeeded."""
        monotonic_usec = time.monotonic_ns() // 1000
        return self.notify(
            "RELOADING=1", f"MONOTONIC_USEC={monotonic_usec}", *_status_field(status)
        )

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown has begun."""
        return self.notify("STOPPING=1", *_status_field(status))

    def status(self, text: str) -> bool:
        """The one line `systemctl status` shows."""
        return self.notify(*_status_field(text))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for `seconds` more before the current start/reload/stop timeout fires; repeat it
        before that time runs out if the step is still going."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={max(0, round(seconds * 1_000_000))}")


def _status_field(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    # A newline would start a new KEY=VALUE field: STATUS= must stay one line.
    line = " ".join(text.splitlines())
    data = line.encode()
    if len(data) > _STATUS_MAX_BYTES:
        line = data[: _STATUS_MAX_BYTES - 3].decode(errors="ignore") + "..."
    return (f"STATUS={line}",)


def watchdog_interval(
    environ: Mapping[str, str] | None = None, *, pid: int | None = None
) -> float | None:
    """The watchdog timeout in seconds from $WATCHDOG_USEC, or None when there is none for us
    (unset, not a positive integer, or $WATCHDOG_PID names another process)."""
    env = os.environ if environ is None else environ
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    if watchdog_pid := env.get("WATCHDOG_PID"):
        try:
            if int(watchdog_pid) != (os.getpid() if pid is None else pid):
                return None
        except ValueError:
            return None
    return usec / 1_000_000


async def run_watchdog(
    notifier: Notifier,
    *,
    interval: float | None = None,
    task_status: trio.TaskStatus[float | None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Send WATCHDOG=1 every half `interval` (default: `watchdog_interval()`) until cancelled.

    `task_status.started()` gets the ping period; with no watchdog or no socket it gets None and
    the task returns at once.
    """
    if interval is None:
        interval = watchdog_interval()
    if interval is None or interval <= 0 or not notifier.enabled:
        task_status.started(None)
        return
    period = interval / 2
    log.debug("watchdog armed", period=period)
    task_status.started(period)
    while True:
        notifier.watchdog()
        await trio.sleep(period)
