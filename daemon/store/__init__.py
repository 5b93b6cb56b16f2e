# The daemon's store: one contract (`await store.write(fn)`, `await store.read(fn)`), two backends
# (daemon/store/sqlite.py, the default, and daemon/store/postgres.py), shared by every area.
#
# Why this shape: the areas import one name, `daemon.store`, and what they take from it is the
# same whichever backend runs. This module only gathers those names; each lives in a module of
# one job:
# - contract.py: what an area's store function gets (Conn) and what the store needs of a
#   database (Backend);
# - writer.py: the Store (one writer thread, group commit, readers) and open_store, which run
#   any backend and never name one;
# - backends.py: choosing the backend `[store]` names (backend_for) or a path's (file_backend);
# - drivers.py: the errors of either driver, for the code that must recognise both;
# - errors.py: the store's own errors; wake.py: wake-ups riding on the writes; dialect.py: the
#   shared SQL as PostgreSQL runs it; copy.py: `store copy` between backends;
# - `one`, `migrate` and `hold_state_dir` are the SQLite module's, exported here for the areas
#   and the command line.
from __future__ import annotations

from daemon.store import wake
from daemon.store.backends import backend_for
from daemon.store.contract import Backend, Conn, StoreHealth, StoreStats
from daemon.store.dialect import in_list
from daemon.store.drivers import DB_ERRORS, DISK_FULL, STORAGE_ERRORS
from daemon.store.errors import StoreClosed, StoreUnavailable
from daemon.store.sqlite import hold_state_dir, migrate, one
from daemon.store.writer import Store, open_store

__all__ = [
    "DB_ERRORS",
    "DISK_FULL",
    "STORAGE_ERRORS",
    "Backend",
    "Conn",
    "Store",
    "StoreClosed",
    "StoreHealth",
    "StoreStats",
    "StoreUnavailable",
    "backend_for",
    "hold_state_dir",
    "in_list",
    "migrate",
    "one",
    "open_store",
    "wake",
]
