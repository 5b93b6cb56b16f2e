"""The documentation site (docs/, built by scripts/docs) cannot drift from the code: every key of
the documented config.toml is in the config reference and every key there is in config.toml;
every route of /openapi.json is in the HTTP API reference; every metric the daemon defines is in
the metrics reference; the README's links into the site point at pages that exist."""

from __future__ import annotations

import re
from pathlib import Path

import trio

from tests.api.conftest import client
from tests.conftest import serve_daemon

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CONFIG_PAGE = DOCS / "reference" / "config.md"
API_PAGE = DOCS / "reference" / "http-api.md"
METRICS_PAGE = DOCS / "reference" / "metrics.md"

_KEY_LINE = re.compile(r"(?:# )?([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)$")
_HEADER = re.compile(r"(?:# )?\[\[?\s*([A-Za-z0-9_.]+)\s*\]\]?")
_INLINE_KEY = re.compile(r"[{,]\s*([A-Za-z_][A-Za-z0-9_]*)\s*=")


def _value_and_rest(text: str) -> tuple[str, int]:
    """The TOML value at the start of `text` with strings blanked and its trailing comment cut,
    and how many brackets it leaves open."""
    out, depth, quote = [], 0, ""
    for ch in text:
        if quote:
            if ch == quote:
                quote = ""
            continue
        if ch in "\"'":
            quote = ch
            out.append('""')
        elif ch == "#":
            break
        else:
            depth += ch in "[{"
            depth -= ch in "]}"
            out.append(ch)
    return "".join(out), depth


def config_keys(text: str) -> set[str]:
    """Every key path config.toml shows, set or commented out (`# key = ...` at the start of a
    line, under a `[table]` or `# [table]` header), with the keys of inline tables in a value
    (`crawl.proxies.url`) and of arrays of tables (`collector.tasks.id`)."""
    keys: set[str] = set()
    table = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("#") and not line.startswith("# "):
            continue
        if line.startswith("# ") and line[2:3] in (" ", ""):
            continue  # prose or a continued comment, not a commented-out key
        header = _HEADER.match(line)
        if header:
            table = header.group(1)
            continue
        key = _KEY_LINE.match(line)
        if not key:
            continue
        path = f"{table}.{key.group(1)}" if table else key.group(1)
        keys.add(path)
        value, depth = _value_and_rest(key.group(2))
        while depth > 0 and i < len(lines):  # a value spread over (commented) lines
            more, change = _value_and_rest(lines[i].lstrip("#"))
            value += more
            depth += change
            i += 1
        keys.update(f"{path}.{inner}" for inner in _INLINE_KEY.findall(value))
    return keys


def config_tables(text: str) -> set[str]:
    """The `[table]` and `[[array.of.tables]]` headers config.toml shows, set or commented out."""
    return set(re.findall(r"^(?:# )?(\[\[?[A-Za-z0-9_.]+\]\]?)", text, re.M))


def documented_keys(page: str) -> set[str]:
    """The key paths the config reference documents: the first cell of each table row."""
    return set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", page, re.M))


def test_the_parser_reads_set_commented_and_inline_keys() -> None:
    sample = (
        "# Prose about keys = not one\n[a]\nx = 1  # note = no\n# y = 2\n"
        "#   continued = no\n"
        '# z = [{ u = "a=b", v_env = "V" },\n#       { w = 1 }]\n'
        "# [b]\n# c = 3\n[[d.e]]\nf = [{ g = 1 }]\n"
    )
    assert config_keys(sample) == {
        "a.x", "a.y", "a.z", "a.z.u", "a.z.v_env", "a.z.w", "b.c", "d.e.f", "d.e.f.g"}  # fmt: skip
    assert config_tables(sample) == {"[a]", "[b]", "[[d.e]]"}


def test_every_config_key_is_documented_and_every_documented_key_exists() -> None:
    shown = config_keys((ROOT / "config.toml").read_text())
    assert {"crawl.concurrency", "llm.base_url", "http.api_key_env"} <= shown
    documented = documented_keys(CONFIG_PAGE.read_text())
    assert sorted(shown - documented) == [], "in config.toml, missing from the config reference"
    assert sorted(documented - shown) == [], "in the config reference, not in config.toml"
    headings = "\n".join(re.findall(r"^#+ .*$", CONFIG_PAGE.read_text(), re.M))
    tables = config_tables((ROOT / "config.toml").read_text())
    assert sorted(t for t in tables if f"`{t}`" not in headings) == []


FULL = """
[daemon]
state_dir = "state"
[crawl.browser]
enabled = false
[http]
bind = "127.0.0.1:0"
[tracker]
enabled = true
base_url = "http://127.0.0.1:9"
[search]
base_url = "http://127.0.0.1:9"
[llm]
base_url = "http://127.0.0.1:9/v1"
model = "m"
"""


async def test_the_http_api_reference_lists_every_route(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Every area on, so every route is in the document."""
    (tmp_path / "crawld.toml").write_text(FULL)
    daemon = await serve_daemon(nursery, tmp_path / "crawld.toml")
    async with client(daemon) as http:
        spec = (await http.get("/openapi.json")).json()
    daemon.request_stop()
    page = API_PAGE.read_text()
    first_cells = re.findall(r"^\| (`[A-Z].*?) \|", page, re.M)
    documented = {
        (method, path)
        for cell in first_cells
        for methods, path in re.findall(r"`([A-Z]+(?:, [A-Z]+)*) (/[^` ]*)`", cell)
        for method in methods.split(", ")
    }
    served = {(m.upper(), path) for path, ops in spec["paths"].items() for m in ops}
    served.add(("GET", "/openapi.json"))
    missing, stale = sorted(served - documented), sorted(documented - served)
    assert not missing, f"served, missing from the HTTP API reference: {missing}"
    assert not stale, f"in the HTTP API reference, not served: {stale}"


_METRIC = re.compile(
    r'(Counter|Gauge|Histogram|GaugeMetricFamily|CounterMetricFamily)\(\s*"(crawld_[a-z_]+)"'
)


def test_every_metric_is_documented() -> None:
    defined: dict[str, str] = {}
    for source in (ROOT / "daemon").rglob("*.py"):
        for kind, name in _METRIC.findall(source.read_text()):
            defined[name + ("_total" if kind.startswith("Counter") else "")] = kind
    assert len(defined) > 40
    page = METRICS_PAGE.read_text()
    documented = set(re.findall(r"^\| `(crawld_[a-z_]+)", page, re.M))
    assert sorted(set(defined) - documented) == [], "defined, missing from the metrics page"
    assert sorted(documented - set(defined)) == [], "documented, not defined"


def test_the_readmes_links_point_at_files() -> None:
    """mkdocs --strict checks the site's links (scripts/docs); the README is not part of it."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    assert any(t.startswith("docs/") for t in targets)
    for target in targets:
        if not re.match(r"[a-z]+:", target):
            assert (ROOT / target).exists(), target
