# The browser's processes as /proc shows them: which were left by a crawld that is gone (its pid
# is in their user-data directory's name), and how much memory a process group uses. Plain
# functions over a /proc folder (a fake one in tests), apart from the pool that calls them.
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

from daemon.logs import get_logger

log = get_logger("crawl.browser")

DIR_PREFIX = "crawld-browser-"
"""The user-data directories' prefix: `crawld-browser-<crawld pid>-<n>-<random>`."""


def _owner_pid(dirname: str) -> int | None:
    rest = dirname[len(DIR_PREFIX) :].split("-", 1)[0]
    return int(rest) if rest.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def processes(proc: Path, marker: str) -> dict[int, str]:
    """{pid: the argument holding `marker`} of the processes with such an argument."""
    found: dict[int, str] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for arg in argv:
            text = arg.decode("utf-8", "replace")
            if marker in text:
                found[int(entry.name)] = text
                break
    return found


def stale_browsers(proc: Path = Path("/proc"), base: str | None = None) -> list[int]:
    """Pids of browser processes (crash handlers included) started by a crawld that is gone:
    an argument names a `crawld-browser-<pid>-…` directory under `base` whose pid is not
    running."""
    marker = os.path.join(base or tempfile.gettempdir(), DIR_PREFIX)
    stale = []
    for pid, arg in processes(proc, marker).items():
        name = arg[arg.index(marker) + len(marker) - len(DIR_PREFIX) :].split("/", 1)[0]
        owner = _owner_pid(name)
        if owner is not None and owner != os.getpid() and not _alive(owner):
            stale.append(pid)
    return stale


def end_stale_browsers() -> int:
    """Kill what `stale_browsers` finds and remove their directories; the number killed."""
    pids = stale_browsers()
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    base = Path(tempfile.gettempdir())
    for path in base.glob(DIR_PREFIX + "*"):
        owner = _owner_pid(path.name)
        if owner is not None and owner != os.getpid() and not _alive(owner):
            shutil.rmtree(path, ignore_errors=True)
    if pids:
        log.warning("ended browsers left by a previous crawld", processes=len(pids))
    return len(pids)


def _pss(entry: Path, page: int) -> int:
    """Proportional set size (shared pages split among their users), RSS where the kernel has
    no smaps_rollup: summing RSS would count Chromium's shared code once per process."""
    try:
        for line in (entry / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int((entry / "statm").read_text().split()[1]) * page


def group_rss(pgid: int, proc: Path = Path("/proc")) -> int:
    """Memory (PSS) of every process in process group `pgid`, in bytes."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid:
                continue
            total += _pss(entry, page)
        except (OSError, ValueError, IndexError):
            continue
    return total
