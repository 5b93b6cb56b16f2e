"""SSRF inside the browser (issue 17, point 4): a page on an allowed host that references the
cloud metadata address, a loopback port outside allow_cidrs, a name resolving to a private
address (by img, iframe, fetch, XHR, WebSocket, beacon, prefetch, a redirect, WebRTC STUN/TURN)
gets none of them. Runs tests/crawl/ssrf_netns.py inside `unshare --net` (loopback only), with
listeners on the forbidden addresses, and asserts they received nothing while the allowed
listener (the positive control) was reached."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from tests.crawl.conftest import need_chromium

ROOT = Path(__file__).resolve().parents[2]
SETUP = (
    "ip link set lo up && ip addr add 169.254.169.254/32 dev lo && "
    "ip addr add 10.0.0.5/32 dev lo && ip addr add 93.184.216.34/32 dev lo && "
    'ip addr add 127.0.0.9/32 dev lo 2>/dev/null; exec "$0" -m tests.crawl.ssrf_netns'
)


def _namespace_usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root for a network namespace with addresses on lo"
    if not (shutil.which("unshare") and shutil.which("ip")):
        return "needs unshare and ip (util-linux, iproute2)"
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        return f"unshare --net is not permitted here: {probe.stderr.decode()[:200]}"
    return None


@pytest.mark.browser
def test_page_reaches_no_forbidden_address() -> None:
    need_chromium()
    problem = _namespace_usable()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"required under CI=true: {problem}", pytrace=False)
        pytest.skip(problem)
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", SETUP, sys.executable],
        cwd=ROOT, capture_output=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    report = msgspec.json.decode(done.stdout.strip().splitlines()[-1])
    hits = report["hits"]
    for forbidden in ("metadata", "loopback", "loopback6", "private", "private-tcp-3478",
                      "private-udp"):  # fmt: skip
        assert hits.get(forbidden, 0) == 0, (forbidden, report)
    assert hits.get("allowed") == 1 and "allowed said OK" in report["markdown"]
    assert report["engine"] == "browser"
    refused = " ".join(report["refused"])
    for reason in ("link-local address 169.254.169.254", "loopback address 127.0.0.1",
                   "private.test resolves only to blocked addresses", "loopback address ::1",
                   "rebind.test resolves only to blocked"):  # fmt: skip
        assert reason in refused
    assert "/redirect/metadata" in report["site_paths"]
