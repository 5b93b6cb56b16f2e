# The window publisher's confirmation slots against aiormq's own confirm handler (no broker): the
# slots must behave like the futures aiormq expects, or acks would be lost silently.
from __future__ import annotations

import asyncio
import types
from typing import Any

import aiormq.exceptions
from aiormq import spec
from aiormq.channel import Channel

from daemon.broker.publish import _PENDING, _Slot, _Window


def _settle(confirmations: dict[int, Any], tag: int, frame: Any) -> None:
    fake = types.SimpleNamespace(confirmations=confirmations)
    Channel._confirm_delivery(fake, tag, frame)  # type: ignore[arg-type]


def test_slots_take_acks_and_nacks_through_aiormqs_handler() -> None:
    loop = asyncio.new_event_loop()
    try:
        window = _Window(loop.create_future(), 3)
        window.left = 3
        confirmations: dict[int, Any] = {
            1: _Slot(window, 0),
            2: _Slot(window, 1),
            3: _Slot(window, 2),
        }
        _settle(confirmations, 1, spec.Basic.Ack(delivery_tag=1))
        _settle(confirmations, 2, spec.Basic.Nack(delivery_tag=2))
        assert not window.future.done() and window.left == 1
        _settle(confirmations, 3, spec.Basic.Ack(delivery_tag=3))
        assert window.future.done() and confirmations == {}
        assert window.outcomes[0] is None and window.outcomes[2] is None
        assert isinstance(window.outcomes[1], aiormq.exceptions.DeliveryError)
    finally:
        loop.close()


def test_a_slot_settles_once_and_an_abandoned_window_ignores_late_confirms() -> None:
    loop = asyncio.new_event_loop()
    try:
        window = _Window(loop.create_future(), 2)
        window.left = 2
        slot = _Slot(window, 0)
        slot.set_exception(RuntimeError("returned"))
        slot.set_result(spec.Basic.Ack(delivery_tag=1))  # the ack after a return changes nothing
        assert isinstance(window.outcomes[0], RuntimeError) and window.left == 1
        window.abandoned = True
        confirmations: dict[int, Any] = {2: _Slot(window, 1)}
        _settle(confirmations, 2, spec.Basic.Ack(delivery_tag=2))
        assert confirmations == {} and window.outcomes[1] is _PENDING
    finally:
        loop.close()
