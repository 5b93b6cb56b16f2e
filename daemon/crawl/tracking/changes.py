# The `changeTracking` format's rules (Firecrawl v2, docs/how-to/change-tracking.md), pure and
# tested with plain values: the request's format object checked (Firecrawl's 400s), the status
# of a page against the markdown of the last scrape of the same (URL, tag) — new, same, changed,
# removed — and the git-style diff: unified hunks with 3 lines of context and no file headers
# (what npm `git-diff` prints), and the same text parsed into parse-diff's structure, which is
# what Firecrawl returns as `diff.json`. The snapshot store and the LLM call are in
# daemon/crawl/tracking/store.py.
from __future__ import annotations

import difflib
import re
from typing import Any

import msgspec

from daemon.crawl.problems import needs_llm, problem
from daemon.llm import rules as llm_rules

KEYS = frozenset({"type", "modes", "schema", "prompt", "tag"})
MODES = ("git-diff", "json")
NEEDS_MARKDOWN = "The changeTracking format requires the markdown format to be specified as well"
ZDR_WARNING = "Change tracking is not supported with zero data retention."
LLM_WARNING = "Structured diff generation failed."
MAX_TAG = 256
NO_NEWLINE = "\\ No newline at end of file"
_IFRAME = re.compile(r"\[iframe\]\([^)]*\)")
_SPACE = re.compile(r"\s+")


class TrackingSpec(msgspec.Struct, frozen=True):
    """A job's changeTracking format, validated."""

    modes: tuple[str, ...] = ()
    tag: str | None = None
    schema: dict[str, Any] | None = None
    prompt: str | None = None
    zero_data_retention: bool = False


def check_format(
    fmt: str | dict[str, Any], where: str, formats: list[Any], llm_configured: bool
) -> list[dict[str, Any]]:
    """Problems (400) of one changeTracking format of `formats`; a schema is replaced by its
    normalised form (Firecrawl's)."""
    names = {f if isinstance(f, str) else f.get("type") for f in formats}
    problems = []
    if "markdown" not in names:
        problems.append(problem(where, NEEDS_MARKDOWN))
    if not isinstance(fmt, dict):
        return problems
    problems += [
        problem(f"{where}.{key}"[:200], "unrecognized key") for key in sorted(fmt)[:20]
        if key not in KEYS
    ]  # fmt: skip
    modes = fmt.get("modes", [])
    if not isinstance(modes, list) or not all(m in MODES for m in modes):
        problems.append(problem(f"{where}.modes", "a list of 'git-diff' and 'json'"))
    elif "json" in modes and not llm_configured:
        problems.append(problem(f"{where}.modes",
                                needs_llm("changeTracking mode 'json'")
                                + "; git-diff works without one"))  # fmt: skip
    tag = fmt.get("tag")
    if tag is not None and (not isinstance(tag, str) or len(tag) > MAX_TAG):
        problems.append(problem(f"{where}.tag", f"a string of at most {MAX_TAG} characters"))
    prompt = fmt.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or len(prompt) > llm_rules.MAX_PROMPT):
        most = llm_rules.MAX_PROMPT
        problems.append(problem(f"{where}.prompt", f"a string of at most {most} characters"))
    if fmt.get("schema") is not None:
        normalized, found = llm_rules.checked_schema(fmt["schema"])
        if found is not None:
            problems.append(problem(f"{where}.schema", found))
        else:
            fmt["schema"] = normalized
    return problems


def tracking_spec(formats: list[Any], zero_data_retention: bool = False) -> TrackingSpec | None:
    """The (validated) changeTracking format of `formats`; None when there is none."""
    for fmt in formats:
        if fmt == "changeTracking":
            return TrackingSpec(zero_data_retention=zero_data_retention)
        if isinstance(fmt, dict) and fmt.get("type") == "changeTracking":
            return TrackingSpec(
                modes=tuple(fmt.get("modes") or ()), tag=fmt.get("tag"),
                schema=fmt.get("schema"), prompt=fmt.get("prompt"),
                zero_data_retention=zero_data_retention,
            )  # fmt: skip
    return None


def comparable(markdown: str) -> str:
    """What the "same" test compares: no whitespace, no `[iframe](…)` links, characters
    sorted (Firecrawl's test: order-insensitive)."""
    return "".join(sorted(_SPACE.sub("", _IFRAME.sub("", markdown))))


def change_status(previous: str | None, current: str, status_code: int) -> str:
    if status_code == 404:
        return "removed"
    if previous is None:
        return "new"
    return "same" if comparable(previous) == comparable(current) else "changed"


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _emit(prefix: str, line: str) -> list[str]:
    if line.endswith("\n"):
        return [prefix + line[:-1]]
    return [prefix + line.rstrip("\r"), NO_NEWLINE]


def _range(start: int, length: int) -> str:
    if length == 1:
        return str(start + 1)
    return f"{start + 1 if length else start},{length}"


def git_diff(previous: str, current: str, context: int = 3) -> str:
    """Unified hunks of previous → current (3 lines of context, no file headers), each line
    ended by a newline; "" when they are equal."""
    old, new = _lines(previous), _lines(current)
    out: list[str] = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        first, last = group[0], group[-1]
        out.append(f"@@ -{_range(first[1], last[2] - first[1])} "
                   f"+{_range(first[3], last[4] - first[3])} @@")  # fmt: skip
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                for line in old[i1:i2]:
                    out += _emit(" ", line)
                continue
            for line in old[i1:i2]:
                out += _emit("-", line)
            for line in new[j1:j2]:
                out += _emit("+", line)
    return "".join(line + "\n" for line in out)


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_diff(text: str) -> dict[str, Any]:
    """`text` (hunks without file headers) in parse-diff's structure, as Firecrawl returns it:
    `{files: [{from, to, chunks: [{content, changes, oldStart, oldLines, newStart, newLines}],
    additions, deletions}]}`; no hunk: no file."""
    chunks: list[dict[str, Any]] = []
    additions = deletions = 0
    ln_del = ln_add = 0
    for line in text.splitlines():
        match = _HUNK.match(line)
        if match:
            old_start, new_start = int(match[1]), int(match[3])
            ln_del, ln_add = old_start, new_start
            chunks.append({
                "content": line, "changes": [],
                "oldStart": old_start, "oldLines": int(match[2] or 1),
                "newStart": new_start, "newLines": int(match[4] or 1),
            })  # fmt: skip
            continue
        if not chunks:
            continue
        changes = chunks[-1]["changes"]
        if line == NO_NEWLINE:
            if changes:
                last = changes[-1]
                changes.append({**last, "content": line})
            continue
        if line.startswith("+"):
            changes.append({"type": "add", "add": True, "ln": ln_add, "content": line})
            ln_add += 1
            additions += 1
        elif line.startswith("-"):
            changes.append({"type": "del", "del": True, "ln": ln_del, "content": line})
            ln_del += 1
            deletions += 1
        else:
            changes.append({"type": "normal", "normal": True, "ln1": ln_del, "ln2": ln_add,
                            "content": line})  # fmt: skip
            ln_del += 1
            ln_add += 1
    if not chunks:
        return {"files": []}
    return {"files": [{"chunks": chunks, "deletions": deletions, "additions": additions,
                       "from": None, "to": None}]}  # fmt: skip


def json_changes(previous: Any, current: Any) -> dict[str, Any]:
    """Firecrawl's structured diff of two extractions of one schema: only the keys whose JSON
    differs, as `{key: {previous, current}}`."""
    before = previous if isinstance(previous, dict) else {}
    after = current if isinstance(current, dict) else {}
    enc = msgspec.json.Encoder(order="sorted").encode
    return {
        key: {"previous": before.get(key), "current": after.get(key)}
        for key in dict.fromkeys([*before, *after])
        if enc(before.get(key)) != enc(after.get(key))
    }


def comparison_content(previous: str, current: str) -> str:
    """What the model reads when no schema diff could be made (Firecrawl's text)."""
    return f"Previous Content: {previous}\n\nCurrent Content: {current}"
