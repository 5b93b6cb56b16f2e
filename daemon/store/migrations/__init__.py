# The schema of each backend: numbered .sql files in `sqlite/` and `postgres/`, the same numbers
# in both (a migration is one change of the store, spelled once per backend's DDL). Each backend
# applies what its database lacks at open and refuses a database newer than itself.
from __future__ import annotations

from importlib import resources


def shipped(backend: str) -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration of `backend`, in order."""
    folder = resources.files("daemon.store.migrations").joinpath(backend)
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql"):
            found.append((int(name.split("_", 1)[0]), name, entry.read_text(encoding="utf-8")))
    found.sort()
    for expected, (version, name, _) in enumerate(found, start=1):
        if version != expected:
            raise RuntimeError(
                f"{backend} migration {name} is out of sequence (expected {expected:04d}_…)"
            )
    return found
