# N `crawld run` processes on one PostgreSQL schema, for the cluster process tests (and the
# cluster benchmark). Each instance has its own config file, state_dir, port and stderr log; the
# config is one TOML document merged from the harness's own settings (store, cluster, http), a
# fragment shared by every instance and a fragment of the instance's own, so an area adds its
# simulators and sections without knowing about the rest. Processes are plain `subprocess.Popen`
# children (a kill -9, SIGSTOP or SIGTERM is one signal away) and every wait is a trio sleep
# loop, so simulators served in the test's own trio loop keep answering while the test waits.
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[2]
DSN_ENV = "CRAWLD_TEST_STORE_DSN"
CRAWLD_RUN = ("-m", "daemon", "run", "--config", "{config}")
"""What an instance runs (python arguments; `{config}` becomes its config file)."""
NO_KEEP_ALIVE = httpx.Limits(max_keepalive_connections=0)
"""The tests' clients open a connection per request: the instances are killed, paused and
restarted on their ports, and a kept-alive connection would meet a process that is gone, or the
server's keep-alive timeout closing it as a request leaves (a reset read as a failure of the
instance on a loaded machine)."""

DEFAULT_BASE = """
[collector]
enabled = false
[crawl.browser]
enabled = false
"""
"""Shared by every instance unless the caller's base says otherwise: no collector (its
Octoparse client would need a simulator) and no browser (`enabled = "auto"` would start one
wherever Chromium is installed)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the process binds it moments later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` over `base`, tables merged key by key (anything else in extra replaces)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def to_toml(doc: dict[str, Any]) -> str:
    """A TOML document for `doc` (tables as [sections], whatever is in an array inline)."""
    lines: list[str] = []

    def table(path: list[str], value: dict[str, Any]) -> None:
        scalars = {k: v for k, v in value.items() if not isinstance(v, dict)}
        if path and (scalars or not value):
            lines.append(f"[{'.'.join(_key(p) for p in path)}]")
        lines.extend(f"{_key(k)} = {_value(v)}" for k, v in scalars.items())
        for k, v in value.items():
            if isinstance(v, dict):
                table([*path, k], v)

    table([], doc)
    return "\n".join(lines) + "\n"


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


@dataclass
class Instance:
    """One crawld of the cluster: `key` names it in the harness, `name` is its
    `[cluster] instance` (the same unless two processes are made to share a name)."""

    key: str
    name: str
    dir: Path
    port: int
    config: Path
    log: Path
    command: tuple[str, ...] = CRAWLD_RUN
    proc: subprocess.Popen[bytes] | None = None
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def state_dir(self) -> Path:
        return self.dir / "state"

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.key} was never started"
        return self.proc.pid

    def stderr(self) -> str:
        """Everything this instance's processes wrote to stderr so far."""
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the running process used so far (Linux /proc)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Instances:
    """crawld processes sharing PostgreSQL schema `schema` of server `dsn` (see the module
    comment). `base` is a TOML fragment every instance gets; `lease` their `[cluster] lease`."""

    def __init__(
        self,
        root: Path,
        dsn: str,
        schema: str,
        *,
        base: str = "",
        lease: str = "2s",
        env: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        self.dsn = dsn
        self.schema = schema
        self.base = merge(tomllib.loads(DEFAULT_BASE), tomllib.loads(base))
        self.lease = lease
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "STATE_DIRECTORY")
        }
        self.env.update({DSN_ENV: dsn, **(env or {})})
        self.by_key: dict[str, Instance] = {}
        self.http = httpx.AsyncClient(trust_env=False, timeout=10, limits=NO_KEEP_ALIVE)

    # Configs ----------------------------------------------------------------------------

    @property
    def store_toml(self) -> str:
        """The `[store]` section every instance has (for a `crawld` command run by hand)."""
        return f'[store]\nkind = "postgres"\ndsn_env = "{DSN_ENV}"\nschema = "{self.schema}"\n'

    def document(self, inst: Instance, extra: str = "", lease: str | None = None) -> str:
        """The whole config of `inst`: the harness's settings, the shared base, then `extra`."""
        own = {
            "daemon": {"state_dir": str(inst.state_dir)},
            "http": {"bind": f"127.0.0.1:{inst.port}"},
            "cluster": {"instance": inst.name, "lease": lease or self.lease},
        }
        doc = merge(merge(tomllib.loads(self.store_toml), self.base), own)
        return to_toml(merge(doc, tomllib.loads(extra)))

    def add(
        self,
        key: str,
        extra: str = "",
        *,
        instance: str | None = None,
        lease: str | None = None,
        command: tuple[str, ...] | None = None,
    ) -> Instance:
        """Write (or rewrite) the config of instance `key`; `instance` is its `[cluster]
        instance` (default: `key`), `extra` a TOML fragment over the shared base, `command`
        what it runs instead of `crawld run` (e.g. a module adding components, as
        tests/cluster/lease_daemon.py)."""
        inst = self.by_key.get(key)
        if inst is None:
            folder = self.root / key
            folder.mkdir(parents=True, exist_ok=True)
            inst = Instance(key, instance or key, folder, free_port(),
                            folder / "crawld.toml", folder / "stderr.log")  # fmt: skip
            self.by_key[key] = inst
        elif instance is not None:
            inst.name = instance
        if command is not None:
            inst.command = command
        inst.config.write_text(self.document(inst, extra, lease))
        return inst

    def __getitem__(self, key: str) -> Instance:
        return self.by_key[key]

    def url(self, key: str) -> str:
        return self.by_key[key].url

    def client(self, key: str, timeout: float = 10) -> httpx.AsyncClient:
        """An HTTP client of instance `key` (a new connection per request: see NO_KEEP_ALIVE)."""
        return httpx.AsyncClient(
            base_url=self.url(key), trust_env=False, timeout=timeout, limits=NO_KEEP_ALIVE
        )

    # Processes --------------------------------------------------------------------------

    def spawn(self, key: str) -> Instance:
        """Start `key`'s process (configured by `add`, or now with defaults) without
        waiting."""
        inst = self.by_key.get(key) or self.add(key)
        if inst.running():
            raise RuntimeError(f"{key} is already running (pid {inst.pid})")
        with inst.log.open("ab") as log:
            log.write(f"--- {' '.join(inst.command)} ({key}) ---\n".encode())
            log.flush()
            inst.proc = subprocess.Popen(
                [sys.executable, *(a.format(config=inst.config) for a in inst.command)],
                env=self.env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        inst.started.append(inst.proc)
        return inst

    async def start(self, key: str, timeout: float = 30) -> Instance:
        """Spawn `key` and wait until its /healthz answers 200; RuntimeError with its stderr
        when it exits first or `timeout` passes."""
        inst = self.spawn(key)
        await self.wait_healthy(key, timeout)
        return inst

    async def wait_healthy(self, key: str, timeout: float = 30) -> None:
        inst = self.by_key[key]
        deadline = trio.current_time() + timeout
        while True:
            if not inst.running():
                code = None if inst.proc is None else inst.proc.returncode
                raise RuntimeError(f"{key} exited ({code}) before /healthz:\n{inst.stderr()}")
            try:
                if (await self.http.get(inst.url + "/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if trio.current_time() > deadline:
                raise RuntimeError(f"{key}: no /healthz 200 within {timeout}s:\n{inst.stderr()}")
            await trio.sleep(0.05)

    async def wait_exit(self, key: str, timeout: float = 30) -> int:
        """Wait for `key`'s process to exit; its exit code (negative: killed by that signal)."""
        proc = self.by_key[key].proc
        assert proc is not None
        with trio.fail_after(timeout):
            while proc.poll() is None:
                await trio.sleep(0.02)
        return proc.returncode

    async def run(self, key: str, timeout: float = 60) -> tuple[int, str]:
        """Run `key` to its end (a process expected to refuse to start): exit code, stderr."""
        inst = self.by_key[key]
        before = len(inst.stderr())
        self.spawn(key)
        code = await self.wait_exit(key, timeout)
        return code, inst.stderr()[before:]

    async def crawld(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
        """Run `crawld ARGS` (e.g. "check-config", "--secrets", path) with the instances'
        environment; its exit code and output (stdout, stderr) whatever the code."""
        with trio.fail_after(timeout):
            result: subprocess.CompletedProcess[bytes] = await trio.run_process(
                [sys.executable, "-m", "daemon", *args],
                env=self.env,
                cwd=ROOT,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        return result

    def kill9(self, key: str) -> None:
        """SIGKILL: no cleanup of any kind (waits for the process to be gone)."""
        inst = self.by_key[key]
        assert inst.proc is not None
        inst.proc.send_signal(signal.SIGKILL)
        inst.proc.wait(timeout=30)

    async def stop(self, key: str, timeout: float = 30) -> int:
        """SIGTERM (SIGCONT first if paused) and wait: the exit code (0 for a clean stop)."""
        inst = self.by_key[key]
        assert inst.proc is not None
        if inst.proc.poll() is None:
            inst.proc.send_signal(signal.SIGTERM)
            inst.proc.send_signal(signal.SIGCONT)
        return await self.wait_exit(key, timeout)

    def pause(self, key: str) -> None:
        """SIGSTOP: the process holds its sockets and leases but does nothing."""
        self.by_key[key].proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]

    def resume(self, key: str) -> None:
        self.by_key[key].proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]

    async def aclose(self) -> None:
        """Kill every process any instance started (SIGKILL works on stopped ones too)."""
        for inst in self.by_key.values():
            for proc in inst.started:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)
        await self.http.aclose()

    # HTTP -------------------------------------------------------------------------------

    async def get(self, key: str, path: str) -> httpx.Response:
        return await self.http.get(self.url(key) + path)

    async def status(self, key: str) -> dict[str, Any]:
        """GET /status as JSON."""
        response = await self.get(key, "/status")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    async def cluster(self, key: str) -> dict[str, Any]:
        """/status's `cluster` section, and its members by instance name under `by_name`."""
        section: dict[str, Any] = (await self.status(key))["cluster"]
        section["by_name"] = {m["instance"]: m for m in section["members"]}
        return section

    async def metrics(self, key: str) -> str:
        response = await self.get(key, "/metrics")
        response.raise_for_status()
        return response.text


async def wait_for(predicate: Any, timeout: float, every: float = 0.1) -> Any:
    """Call (and await, if async) `predicate` until it returns something truthy; return it.
    trio.TooSlowError after `timeout` seconds."""
    with trio.fail_after(timeout):
        while True:
            value = predicate()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return value
            await trio.sleep(every)
