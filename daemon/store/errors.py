# Errors of the store itself, whichever the backend; kept apart so each backend module can name
# them without importing the store (which imports the backends).
from __future__ import annotations


class StoreUnavailable(RuntimeError):
    """The store cannot be opened: the message names the backend, where, and why (a server
    that cannot be reached, a state dir another process holds, a schema newer than this crawld)."""


class StoreClosed(Exception):
    """The store was closed while a caller still wanted it."""
