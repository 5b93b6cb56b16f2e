"""Schemathesis against crawld's own /openapi.json: every route, with `--checks all`, once with no
API key configured and once with one.

    .venv/bin/python scripts/api_fuzz.py [--max-examples N] [--seed N] [--keep]
        [--only key|no-key] [-- more schemathesis options]

The routes that fetch pages (scrape, crawl, batch, map, search, extract, v1 and v2) are fuzzed
too, so the whole run happens in a network namespace of its own (`unshare --net`, only loopback
up; as root, or with a user namespace otherwise): no packet can leave the machine, whatever URL
schemathesis makes up, and the script refuses to run without it. Inside, a host name does not
resolve (Firecrawl's 200 with SCRAPE_DNS_RESOLUTION_ERROR) and an address is loopback or private,
refused by crawld's SSRF guard (403), or unreachable. [llm] and [search] point at the bundled
simulators (daemon/fakes/) on loopback, so extract, search and the LLM formats are served as a
configured deployment serves them; the browser is off. GET /discover answers from the config
alone (no collector account) and never calls Octoparse.

What JSON Schema cannot state (waitFor at most half of timeout; a v1 crawl's URL depth within
maxDepth) is told to the generator by scripts/api_fuzz_hooks.py. Two checks are configured for
what crawld means on purpose (SCHEMATHESIS_CONFIG below): a 408 (the request's own `timeout`
passed) answers a valid scrape, map or search, and a job read after its DELETE (a cancel, as
Firecrawl's) is still there. The multipart upload (POST /v2/parse) is fuzzed in an invocation of
its own without negative_data_rejection, which misreads its file part (PARTS below).

Each run starts `crawld run` in a process of its own (a fresh state directory, an ephemeral
port, the collector off), waits for /healthz, runs the schemathesis CLI (PARTS) with HAR
reports, stops crawld and prints the operations it tested (of those the document has), the
requests it made, its failures and errors and how long it took. The exit status is non-zero
when a run has a failure or an error, or tested fewer operations than the document has.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchkit import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
KEY_ENV = "CRAWLD_FUZZ_API_KEY"
KEY = "fuzz-" + os.urandom(16).hex()
ISOLATED = "CRAWLD_FUZZ_ISOLATED"
RUN_NAMES = {False: "no-key", True: "key"}

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
[search]
base_url = "{searxng}"
[llm]
base_url = "{llm}/v1"
model = "fuzz"
retries = 0
"""


SCHEMATHESIS_CONFIG = """
# Operations that take the client's own `timeout`: a 408 answers a valid request whose deadline
# passed (Firecrawl's SCRAPE_TIMEOUT, MAP_TIMEOUT, SEARCH_TIMEOUT), it does not refuse it.
[[operations]]
include-path-regex = "^/v[12]/(scrape|map|search)$"
[operations.checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "408", "409", "429", "5xx"]

# An upload whose bytes crawld cannot read (random bytes, an image without OCR, a damaged PDF)
# is a 415 or 422 about the file's content, which no schema of the form can state.
[[operations]]
include-path-regex = "^/v2/parse$"
[operations.checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "408", "409", "415", "422", "429", "5xx"]
# schemathesis 4.32.5's coverage phase fails on a binary part ("Unsupported type: 'Binary'"):
# the upload is fuzzed in the other phases.
[operations.phases.coverage]
enabled = false
"""


PARTS = [
    (["--exclude-path-regex", "^/v2/parse$"], "use_after_free"),
    (["--include-path-regex", "^/v2/parse$"], "use_after_free,negative_data_rejection"),
]
"""Each run's two schemathesis invocations: (operations, checks left out). DELETE
/v2/crawl/{id} (its batch and v1 twins too) cancels a job, as Firecrawl's does: the job stays
readable with status "cancelled", so a read after it answers 200 by design (use_after_free; they
are the only DELETE routes with something to read after them: DELETE /v2/cache has none).
The multipart upload runs apart without negative_data_rejection: schemathesis 4.32.5 re-reads a
multipart body "as sent" to see whether a mutation survived, and its validator takes the sent
file part (bytes) for a non-string, so every such body reads as invalid and a mutation that
leaves the options valid (one branch of an anyOf negated while another holds) is reported as
"schema-violating request accepted"; the options' refusals are checked by
tests/crawlapi/test_sdk_parse.py."""


def isolate(argv: list[str]) -> None:
    """Run this script again in a network namespace with only loopback up, unless it already
    runs in one; exits when no namespace can be made."""
    if os.environ.get(ISOLATED) == "1":
        interfaces = {name for _, name in socket.if_nameindex()}
        if interfaces != {"lo"}:
            raise SystemExit(f"not isolated: network interfaces {sorted(interfaces)}")
        return
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        raise SystemExit("api_fuzz needs `unshare` and `ip` (util-linux, iproute2) to isolate")
    user = [] if os.geteuid() == 0 else ["--map-root-user"]
    command = [unshare, "--net", *user, "--", "sh", "-c", f'{ip} link set lo up && exec "$@"',
               "sh", sys.executable, str(Path(__file__).resolve()), *argv]  # fmt: skip
    os.execve(unshare, command, {**os.environ, ISOLATED: "1"})


def wait_for(url: str, proc: subprocess.Popen[bytes], healthy: bool, timeout: float = 30) -> None:
    """Until `url` answers (with a 2xx when `healthy`); exits when `proc` ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError as exc:
            if not healthy:
                return  # it answers
            if exc.code != 503:
                raise
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not answer in time")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def serving(command: list[str], url: str, log: Path, env: dict[str, str] | None = None,
            healthy: bool = False) -> Iterator[None]:  # fmt: skip
    """`command` running (its output in `log`) until the block ends; `url` answers meanwhile."""
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=out)
        try:
            wait_for(url, proc, healthy)
            yield
        finally:
            stop(proc)


@contextmanager
def simulators(workdir: Path) -> Iterator[tuple[str, str]]:
    """The SearXNG and LLM simulators on loopback: their base URLs."""
    searxng, llm = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    python = [sys.executable, "-m"]
    with serving([*python, "daemon.fakes.searxng", "--bind", searxng],
                 f"http://{searxng}/search?q=x&format=json", workdir / "searxng.log"), \
         serving([*python, "daemon.fakes.openai_compat", "--bind", llm],
                 f"http://{llm}/v1/models", workdir / "llm.log"):  # fmt: skip
        yield f"http://{searxng}", f"http://{llm}"


def summary(output: str) -> tuple[int, int, int]:
    """(operations tested, failures, errors) as schemathesis's summary states them."""
    tail = output.split("SUMMARY")[-1]

    def count(pattern: str) -> int:
        found = re.search(pattern, tail)
        return int(found.group(1)) if found else 0

    return (count(r"Tested:\s+(\d+)"),
            count(r"(\d+) (?:unique )?failures?\b"), count(r"(\d+) errors?\b"))  # fmt: skip


def run(
    keyed: bool, workdir: Path, upstreams: tuple[str, str], extra: list[str]
) -> dict[str, float]:
    """One schemathesis run against a fresh crawld: seconds, operations, requests, failures,
    errors and the operations the document has."""
    name = RUN_NAMES[keyed]
    state = workdir / name
    state.mkdir()
    port = free_port()
    config = state / "crawld.toml"
    key_line = f'api_key_env = "{KEY_ENV}"' if keyed else ""
    config.write_text(CONFIG.format(state=state, port=port, key=key_line,
                                    searxng=upstreams[0], llm=upstreams[1]))  # fmt: skip
    env = {**os.environ, KEY_ENV: KEY, "PYTHONPATH": str(ROOT)}
    hooks = {"SCHEMATHESIS_HOOKS": "api_fuzz_hooks",
             "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(ROOT)])}  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    har = state / "requests.har"
    settings = state / "schemathesis.toml"
    settings.write_text(SCHEMATHESIS_CONFIG)
    # Hypothesis's too_slow health check times the generator, not the server: the scrape and
    # batch bodies are large schemas whose first examples take it longer than the check allows
    # on a busy 2-core machine (the examples are made all the same, and sent).
    base = [str(BIN / "schemathesis"), "--config-file", str(settings), "run",
            f"{url}/openapi.json", "--checks", "all", "--suppress-health-check", "too_slow",
            "--no-color", "--report", "har", *extra]  # fmt: skip
    auth = ("Authorization", f"Bearer {KEY}") if keyed else None
    if auth:
        base += ["-H", f"{auth[0]}: {auth[1]}"]
    outputs, codes, requests = [], [], 0
    with serving([str(BIN / "crawld"), "run", "--config", str(config)], f"{url}/healthz",
                 state / "crawld.log", env, healthy=True):  # fmt: skip
        asked = urllib.request.Request(f"{url}/openapi.json", headers=dict([auth]) if auth else {})
        document = json.loads(urllib.request.urlopen(asked).read())
        started = time.monotonic()
        for part, (select, skip) in enumerate(PARTS):
            har = state / f"requests-{part}.har"
            command = [*base, *select, "--exclude-checks", skip, "--report-har-path", str(har)]
            done = subprocess.run(command, capture_output=True, text=True, check=False,
                                  cwd=state, env={**os.environ, **hooks})  # fmt: skip
            outputs.append((done.stdout + done.stderr).replace(KEY, "<key>"))
            codes.append(done.returncode)
            requests += len(json.loads(har.read_text())["log"]["entries"]) if har.exists() else 0
        seconds = time.monotonic() - started
    output = "\n".join(outputs)
    (state / "schemathesis.txt").write_text(output)
    declared = sum(len(methods) for methods in document["paths"].values())
    counted = [summary(text) for text in outputs]
    operations, failures, errors = (sum(c[i] for c in counted) for i in range(3))
    for code, (_, failed, erred) in zip(codes, counted, strict=True):
        if code != 0 and not (failed or erred):
            errors += 1  # schemathesis failed without saying why in its summary
    if any(codes) or operations < declared:
        print(output, file=sys.stderr)
    print(f"{name}: {operations}/{declared} operations, {requests} requests, {failures} failures,"
          f" {errors} errors, {seconds:.1f} s (schemathesis exit {max(codes)})")  # fmt: skip
    return {"seconds": seconds, "operations": operations, "declared": declared,
            "requests": requests, "failures": failures, "errors": errors}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=25)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the logs and reports")
    parser.add_argument("--only", choices=("key", "no-key"), help="run one of the two runs")
    parser.add_argument("schemathesis", nargs="*", help="more schemathesis options (after --)")
    args = parser.parse_args()
    isolate(sys.argv[1:])
    extra = ["--max-examples", str(args.max_examples), *args.schemathesis]
    if args.seed is not None:
        extra += ["--seed", str(args.seed)]
    workdir = Path(tempfile.mkdtemp(prefix="crawld-fuzz-"))
    try:
        with simulators(workdir) as upstreams:
            runs = [keyed for keyed in (False, True) if args.only in (None, RUN_NAMES[keyed])]
            results = [run(keyed, workdir, upstreams, extra) for keyed in runs]
    finally:
        if args.keep:
            print(f"logs and reports in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    total = {k: sum(r[k] for r in results) for k in results[0]}
    print(f"total: {total['operations']:.0f} operations tested of {total['declared']:.0f},"
          f" {total['requests']:.0f} requests, {total['failures']:.0f} failures,"
          f" {total['errors']:.0f} errors, {total['seconds']:.1f} s")  # fmt: skip
    bad = total["failures"] or total["errors"] or total["operations"] < total["declared"]
    if args.schemathesis:  # a partial run: only its failures count
        bad = total["failures"] or total["errors"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
