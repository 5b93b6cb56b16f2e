# Trio has no restarting supervisor; this is the small one crawld needs. Each component runs in
# the daemon's nursery inside `supervise`, which catches `Exception` only (cancellation and
# KeyboardInterrupt still propagate), logs it, waits a capped, jittered, exponential backoff and
# starts the component again; its siblings never notice. A component that fails `max_restarts`
# times within `window` seconds is beyond repair here: the error is re-raised, the process exits
# non-zero and systemd's Restart= takes over (Erlang's "restart intensity").
#
# The restart rules are pure functions over plain values so tests can table them; the loop is
# driven by trio's clock, so tests run it under autojump_clock.
from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from daemon.logs import get_logger

log = get_logger("supervise")


class GaveUp(Exception):
    """A component failed too often; the daemon must stop."""


def restart_delay(failures: int, base: float, cap: float, rng: random.Random) -> float:
    """Backoff before restart number `failures` (1-based): full jitter over base·2^(n-1), capped."""
    ceiling = min(cap, base * 2 ** (failures - 1))
    return ceiling / 2 + rng.random() * ceiling / 2


def failures_in_window(times: list[float], now: float, window: float) -> list[float]:
    return [t for t in times if now - t <= window]


@dataclass
class ComponentState:
    """What /status shows about one supervised component."""

    name: str
    state: str = "starting"  # starting | running | backoff | stopped | failed
    restarts: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    started_at: float | None = None
    failure_times: list[float] = field(default_factory=list)
    finished: trio.Event = field(default_factory=trio.Event)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "restarts": self.restarts,
            "last_error": self.last_error,
        }


def describe(exc: BaseException) -> str:
    """`Type: message` of an error, looking through single-member exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


ComponentFn = Callable[..., Awaitable[None]]


async def supervise(
    state: ComponentState,
    fn: ComponentFn,
    *,
    max_restarts: int,
    window: float,
    backoff_base: float = 0.5,
    backoff_cap: float = 30.0,
    rng: random.Random | None = None,
    on_restart: Callable[[ComponentState], None] | None = None,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run `fn(task_status=…)` forever, restarting it after failures.

    `task_status.started()` is passed through the first time the component reports it started,
    so `nursery.start(supervise, …)` returns once the component is up. A component that fails
    before its first start is still restarted; the caller keeps waiting.
    """
    rng = rng or random.Random()
    reported = False
    while True:
        try:
            async with trio.open_nursery() as inner:
                value = await inner.start(fn)
                state.state = "running"
                state.started_at = trio.current_time()
                if not reported:
                    reported = True
                    task_status.started(value)
            state.state = "stopped"
            state.finished.set()
            return
        except Exception as exc:
            now = trio.current_time()
            state.failure_times = failures_in_window(state.failure_times, now, window)
            state.failure_times.append(now)
            state.last_error = describe(exc)
            state.last_error_at = now
            if len(state.failure_times) >= max_restarts:
                state.state = "failed"
                state.finished.set()
                log.critical(
                    "component failed too often, giving up",
                    component=state.name,
                    failures=len(state.failure_times),
                    window_s=window,
                    exc_info=exc,
                )
                raise GaveUp(f"{state.name} failed {len(state.failure_times)} times") from exc
            delay = restart_delay(len(state.failure_times), backoff_base, backoff_cap, rng)
            state.state = "backoff"
            log.error(
                "component failed, restarting",
                component=state.name,
                delay_s=round(delay, 2),
                exc_info=exc,
            )
            await trio.sleep(delay)
            state.restarts += 1
            state.state = "starting"
            if on_restart is not None:
                on_restart(state)
