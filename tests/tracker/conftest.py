from __future__ import annotations

from typing import Any

import pytest
import trio


@pytest.fixture
def inline_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the store's SQLite calls on the trio thread: autojump_clock treats a task waiting for
    a worker thread as idle and would jump virtual time while a query runs, so how late a
    snapshot ran would depend on how busy the machine is."""

    async def run_sync(fn: Any, *args: Any, **_: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return fn(*args)

    monkeypatch.setattr(trio.to_thread, "run_sync", run_sync)
