from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import apsw
import pytest
import trio

from daemon.store import Store, _read_tx

T = TypeVar("T")


@pytest.fixture
def inline_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the store's transactions on the trio thread: autojump_clock treats a task waiting for
    the writer or a reader thread as idle and would jump virtual time while a query runs, so how
    late a snapshot ran would depend on how busy the machine is. Each write is its own
    transaction here (no group commit), which the callers cannot tell apart."""

    async def write(self: Store, fn: Callable[[apsw.Connection], T]) -> T:
        await trio.lowlevel.checkpoint()
        with self._writer:
            return fn(self._writer)

    async def read(self: Store, fn: Callable[[apsw.Connection], T]) -> T:
        await trio.lowlevel.checkpoint()
        return _read_tx(self._readers[0], fn)

    monkeypatch.setattr(Store, "write", write)
    monkeypatch.setattr(Store, "read", read)
