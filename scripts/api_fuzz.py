"""Schemathesis against crawld's own /openapi.json: every documented route but those that fetch
the network, with `--checks all`, once with no API key configured and once with one.

    .venv/bin/python scripts/api_fuzz.py [--max-examples N] [--seed N]

Each run starts `crawld run` in a process of its own (a fresh state directory, loopback only, an
ephemeral port, the collector off), waits for /healthz, runs the schemathesis CLI with a HAR
report, stops crawld and prints how long the run took, how many requests it made and how many
failures it found. The exit status is non-zero when any run has a failure.

Left out, because they fetch pages or call upstreams: POST /v2/scrape, /v2/crawl,
/v2/batch/scrape, /v2/map, /v2/search, /v2/extract, their /v1 twins (and jobs they would start).
GET /discover is fuzzed: with no collector account configured it answers from the config alone
and never calls Octoparse.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
KEY_ENV = "CRAWLD_FUZZ_API_KEY"
KEY = "fuzz-" + os.urandom(16).hex()
NETWORK_PATHS = [
    "/v2/scrape",
    "/v2/crawl",
    "/v2/batch/scrape",
    "/v2/map",
    "/v2/search",
    "/v2/extract",
    "/v1/scrape",
    "/v1/crawl",
    "/v1/batch/scrape",
    "/v1/map",
    "/v1/search",
    "/v1/extract",
]

CONFIG = """
[daemon]
state_dir = "{state}"
[http]
bind = "127.0.0.1:{port}"
{key}
[crawl.browser]
enabled = false
[collector]
enabled = false
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"crawld exited with {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("crawld did not answer /healthz in time")


def run(keyed: bool, workdir: Path, extra: list[str]) -> tuple[float, int, int]:
    """(seconds, requests, failures) of one schemathesis run against a fresh crawld."""
    name = "key" if keyed else "no-key"
    state = workdir / name
    state.mkdir()
    port = free_port()
    config = state / "crawld.toml"
    key_line = f'api_key_env = "{KEY_ENV}"' if keyed else ""
    config.write_text(CONFIG.format(state=state, port=port, key=key_line))
    env = {**os.environ, KEY_ENV: KEY}
    url = f"http://127.0.0.1:{port}"
    daemon = subprocess.Popen(
        [str(BIN / "crawld"), "run", "--config", str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(state / "crawld.log").open("wb"),
    )
    har = state / "requests.har"
    try:
        wait_healthy(url, daemon)
        command = [str(BIN / "schemathesis"), "run", f"{url}/openapi.json", "--checks", "all",
                   "--no-color", "--report", "har", "--report-har-path", str(har),
                   *extra]  # fmt: skip
        for path in NETWORK_PATHS:
            command += ["--exclude-path", path]
        if keyed:
            command += ["-H", f"Authorization: Bearer {KEY}"]
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=state)
        seconds = time.monotonic() - started
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    output = done.stdout + done.stderr
    requests = len(json.loads(har.read_text())["log"]["entries"]) if har.exists() else 0
    found = re.search(r"(\d+) (?:unique )?failures?\b", output.split("SUMMARY")[-1])
    failures = int(found.group(1)) if found else (0 if done.returncode == 0 else -1)
    if done.returncode != 0:
        print(output.replace(KEY, "<key>"), file=sys.stderr)
    print(f"{name}: {seconds:.1f} s, {requests} requests, {failures} failures"
          f" (schemathesis exit {done.returncode})")  # fmt: skip
    return seconds, requests, failures if done.returncode == 0 else max(failures, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=50)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    extra = ["--max-examples", str(args.max_examples)]
    if args.seed is not None:
        extra += ["--seed", str(args.seed)]
    with tempfile.TemporaryDirectory(prefix="crawld-fuzz-") as tmp:
        results = [run(keyed, Path(tmp), extra) for keyed in (False, True)]
    seconds = sum(r[0] for r in results)
    requests = sum(r[1] for r in results)
    failures = sum(r[2] for r in results)
    print(f"total: {seconds:.1f} s, {requests} requests, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
