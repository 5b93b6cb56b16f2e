# The console's view of a changed monitor page (issue 34): the unified diff a check stores
# (`diff.text`, hunks of markdown) read into rows the page draws either unified or side by side,
# with the words that changed inside a replaced line marked. Pure rules over the stored text on
# the server, so they are tested with plain values and the browser only builds elements from
# the strings given (the diff is page content: it never becomes markup). A field diff
# (changeTracking's json mode, `{field: {previous, current}}`) becomes rows of fields.
from __future__ import annotations

import difflib
import itertools
import json
import re
from typing import Any

MAX_LINES = 5000
"""Diff lines read into the view; the lines past it are only counted (a page rewritten whole)."""
MAX_MARK = 2000
"""Characters beyond which a replaced line is not compared word by word."""
MIN_LIKENESS = 0.4
"""Below this likeness (difflib's ratio over words) a replaced line is shown whole: marking
its words would mark nearly all of them."""
MAX_FIELD = 10_000
"""Characters of a field's JSON shown (previous and current each)."""

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")
_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")

Part = list[Any]
"""[text, changed]: a piece of a line, `changed` when it differs from the paired line."""


def _merge(parts: list[Part]) -> list[Part]:
    out: list[Part] = []
    for text, changed in parts:
        if not text:
            continue
        if out and out[-1][1] == changed:
            out[-1][0] += text
        else:
            out.append([text, changed])
    return out or [["", False]]


def word_marks(old: str, new: str) -> tuple[list[Part], list[Part]]:
    """The parts of a removed line and of the line that replaced it, the differing words
    marked; both whole and unmarked when the lines are long or have too little in common."""
    whole = ([[old, False]], [[new, False]])
    if len(old) > MAX_MARK or len(new) > MAX_MARK:
        return whole
    a, b = _TOKEN.findall(old), _TOKEN.findall(new)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    if matcher.ratio() < MIN_LIKENESS:
        return whole
    left: list[Part] = []
    right: list[Part] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        changed = tag != "equal"
        left.append(["".join(a[i1:i2]), changed])
        right.append(["".join(b[j1:j2]), changed])
    return _merge(left), _merge(right)


class _Rows:
    """The two views built side by side while the diff's lines are read."""

    def __init__(self) -> None:
        self.unified: list[dict[str, Any]] = []
        self.split: list[dict[str, Any]] = []
        self.dels: list[tuple[int, str]] = []
        self.adds: list[tuple[int, str]] = []

    def banner(self, kind: str, text: str) -> None:
        self.flush()
        self.unified.append({"kind": kind, "text": text})
        self.split.append({"kind": kind, "text": text})

    def context(self, old: int, new: int, text: str) -> None:
        self.flush()
        parts = [[text, False]]
        self.unified.append({"kind": "ctx", "old": old, "new": new, "parts": parts})
        self.split.append({"kind": "line", "left": {"kind": "ctx", "n": old, "parts": parts},
                           "right": {"kind": "ctx", "n": new, "parts": parts}})  # fmt: skip

    def flush(self) -> None:
        """The pending run of removed lines and the added ones after it: the i-th removed
        line is paired with the i-th added one (their words compared)."""
        if not self.dels and not self.adds:
            return
        left: list[dict[str, Any]] = []
        right: list[dict[str, Any]] = []
        for d, a in itertools.zip_longest(self.dels, self.adds):
            if d is not None and a is not None:
                dp, ap = word_marks(d[1], a[1])
                left.append({"kind": "del", "n": d[0], "parts": dp})
                right.append({"kind": "add", "n": a[0], "parts": ap})
            elif d is not None:
                left.append({"kind": "del", "n": d[0], "parts": [[d[1], False]]})
            elif a is not None:
                right.append({"kind": "add", "n": a[0], "parts": [[a[1], False]]})
        self.unified += [{"kind": "del", "old": c["n"], "new": None, "parts": c["parts"]}
                         for c in left]  # fmt: skip
        self.unified += [{"kind": "add", "old": None, "new": c["n"], "parts": c["parts"]}
                         for c in right]  # fmt: skip
        self.split += [{"kind": "line", "left": lc, "right": rc}
                       for lc, rc in itertools.zip_longest(left, right)]  # fmt: skip
        self.dels, self.adds = [], []


def text_view(text: str, max_lines: int = MAX_LINES) -> dict[str, Any]:
    """`text` (unified hunks, as a check's `diff.text`) as `unified` rows (kind hunk, ctx, del,
    add or note; `old`/`new` line numbers; `parts`) and `split` rows (hunk and note banners, or
    `line` with a `left` and a `right` cell, either None where the other side has no line),
    with the counts of `added` and `removed` lines and of the lines `cut` past `max_lines`."""
    rows = _Rows()
    lines = text.splitlines()
    old = new = 0
    added = removed = 0
    in_hunk = False
    for line in lines[:max_lines]:
        match = _HUNK.match(line)
        if match:
            old, new = int(match[1]), int(match[2])
            in_hunk = True
            rows.banner("hunk", line)
        elif not in_hunk:
            continue  # file headers (---, +++) or anything before the first hunk
        elif line.startswith("\\"):
            rows.banner("note", line[1:].strip())
        elif line.startswith("-"):
            if rows.adds:
                rows.flush()
            rows.dels.append((old, line[1:]))
            old += 1
            removed += 1
        elif line.startswith("+"):
            rows.adds.append((new, line[1:]))
            new += 1
            added += 1
        else:
            rows.context(old, new, line[1:])
            old += 1
            new += 1
    rows.flush()
    cut = max(0, len(lines) - max_lines)
    return {"unified": rows.unified, "split": rows.split, "added": added, "removed": removed,
            "cut": cut}  # fmt: skip


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= MAX_FIELD else text[:MAX_FIELD] + "…"


def field_rows(diff_json: Any) -> list[dict[str, str]]:
    """A field diff `{field: {previous, current}}` as rows of the field and both values as
    text; [] for anything else (parse-diff's `{files: …}` structure is the text's)."""
    if not isinstance(diff_json, dict) or "files" in diff_json:
        return []
    rows = []
    for name, change in diff_json.items():
        if isinstance(change, dict) and ("previous" in change or "current" in change):
            rows.append({"field": str(name), "previous": _shown(change.get("previous")),
                         "current": _shown(change.get("current"))})  # fmt: skip
    return rows


def view(diff: Any) -> dict[str, Any]:
    """The view of a page's `diff` (None or `{text?, json?}`): `text_view` of its text (empty
    rows without one) and `fields` of its field diff."""
    diff = diff if isinstance(diff, dict) else {}
    text = diff.get("text")
    shown = text_view(text if isinstance(text, str) else "")
    shown["fields"] = field_rows(diff.get("json"))
    return shown
