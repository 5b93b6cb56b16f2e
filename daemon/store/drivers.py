# What either database driver raises or hands back, for the code that must recognise both: the
# writer (which errors mean the database cannot take writes, which results are cursors to close),
# the HTTP layer (507 on disk full, 503 while storage is gone) and the areas (DB_ERRORS around
# their writes).
#
# Why apart: the writer runs whichever backend it is given and never chooses one; these tuples
# name both drivers so that nothing else has to. Each backend module lists its own storage errors;
# this one joins them.
from __future__ import annotations

import apsw
import psycopg
import psycopg.errors
import psycopg_pool

from daemon.store.postgres import STORAGE_ERRORS as PG_STORAGE_ERRORS
from daemon.store.sqlite import STORAGE_ERRORS as SQLITE_STORAGE_ERRORS

DB_ERRORS: tuple[type[BaseException], ...] = (apsw.Error, psycopg.Error, psycopg_pool.PoolTimeout)
"""What a statement of either backend can raise: areas catch these around their writes."""

DISK_FULL: tuple[type[BaseException], ...] = (apsw.FullError, psycopg.errors.DiskFull)
"""Either backend's "no space left" (HTTP 507)."""

STORAGE_ERRORS: tuple[type[BaseException], ...] = SQLITE_STORAGE_ERRORS + PG_STORAGE_ERRORS
"""Errors of either backend that mean the database cannot take writes now (disk full, I/O,
server gone), not a bad job."""

CURSORS: tuple[type, ...] = (apsw.Cursor, psycopg.Cursor)
"""What a write job may return that holds the writer's connection (closed before it goes back)."""
