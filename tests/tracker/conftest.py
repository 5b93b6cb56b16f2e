from __future__ import annotations

import pytest

from daemon.store import Store


@pytest.fixture
def inline_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the store's SQLite calls on the trio thread: autojump_clock treats a task waiting for
    a worker thread as idle and would jump virtual time while a query runs, so how late a
    snapshot ran would depend on how busy the machine is."""
    monkeypatch.setattr(Store, "inline", True)
