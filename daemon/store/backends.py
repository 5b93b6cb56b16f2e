# Choosing a backend: the one `[store]` names (backend_for), or the file a bare path means
# (file_backend: a SQLite database, the default store).
#
# Why apart: choosing is the only place that must know which backends exist. The writer
# (daemon/store/writer.py) runs whatever backend it is handed, and the areas only see the
# contract (daemon/store/contract.py).
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from daemon.store.sqlite import SqliteBackend

if TYPE_CHECKING:
    from daemon import config
    from daemon.store.contract import Backend


def file_backend(path: Path, **options: Any) -> Backend:
    """The store in the file at `path` (options: SqliteBackend's synchronous, busy_timeout,
    readers)."""
    return SqliteBackend(path, **options)


def backend_for(cfg: config.CoreConfig) -> Backend:
    """The backend `[store]` names (the secret behind `dsn_env` must be set: check_secrets)."""
    from daemon import config as config_module

    store = cfg.store
    if store.kind == "postgres":
        from daemon.store.postgres import PostgresBackend

        assert store.dsn_env is not None
        return PostgresBackend(
            os.environ[store.dsn_env],
            schema=store.schema,
            pool_size=store.pool_size,
            connect_timeout=store.connect_timeout,
            idle_in_transaction_ms=max(500, int(cfg.cluster.lease * 1000 / 3)),
        )
    return file_backend(
        config_module.state_dir(cfg) / "crawld.db",
        synchronous=store.synchronous,
        busy_timeout=store.busy_timeout,
    )
