"""The monitors page's diff view as plain values: the hunks a check stores read into unified and
side-by-side rows with line numbers, a replaced line's changed words marked, runs of unequal
length paired, notes and file headers, the cut past the line cap, and field diffs."""

from __future__ import annotations

from daemon.crawl.tracking.changes import git_diff
from daemon.ui import diffview


def kinds(rows: list[dict]) -> list[str]:
    return [r["kind"] for r in rows]


def test_a_replaced_line_marks_the_changed_words_in_both_views() -> None:
    text = git_diff("# Price\n\nPrice: 10 EUR\n\nfooter\n", "# Price\n\nPrice: 12 EUR\n\nfooter\n")
    shown = diffview.text_view(text)
    assert (shown["added"], shown["removed"], shown["cut"]) == (1, 1, 0)
    assert kinds(shown["unified"]) == ["hunk", "ctx", "ctx", "del", "add", "ctx", "ctx"]
    dels = [r for r in shown["unified"] if r["kind"] == "del"]
    adds = [r for r in shown["unified"] if r["kind"] == "add"]
    assert dels[0]["parts"] == [["Price: ", False], ["10", True], [" EUR", False]]
    assert adds[0]["parts"] == [["Price: ", False], ["12", True], [" EUR", False]]
    assert (dels[0]["old"], dels[0]["new"], adds[0]["old"], adds[0]["new"]) == (3, None, None, 3)
    paired = [r for r in shown["split"] if r["kind"] == "line" and r["left"]["kind"] == "del"]
    assert len(paired) == 1
    assert paired[0]["left"] == {"kind": "del", "n": 3, "parts": dels[0]["parts"]}
    assert paired[0]["right"] == {"kind": "add", "n": 3, "parts": adds[0]["parts"]}
    ctx = shown["split"][1]
    assert ctx["left"]["kind"] == ctx["right"]["kind"] == "ctx"
    assert (ctx["left"]["n"], ctx["right"]["n"]) == (1, 1)


def test_unequal_runs_leave_a_side_empty_and_unlike_lines_whole() -> None:
    text = "@@ -10,2 +10,3 @@\n ctx\n-old line about cats\n+something else entirely\n+and more\n"
    shown = diffview.text_view(text)
    unified = shown["unified"]
    assert kinds(unified) == ["hunk", "ctx", "del", "add", "add"]
    assert [(r.get("old"), r.get("new")) for r in unified[1:]] == [
        (10, 10), (11, None), (None, 11), (None, 12)]  # fmt: skip
    assert unified[2]["parts"] == [["old line about cats", False]]  # too unlike to mark words
    lines = shown["split"][2:]
    assert lines[0]["left"]["kind"] == "del" and lines[0]["right"]["kind"] == "add"
    assert lines[1]["left"] is None and lines[1]["right"]["parts"] == [["and more", False]]


def test_an_added_run_then_a_removed_one_are_two_runs() -> None:
    shown = diffview.text_view("@@ -1,2 +1,2 @@\n+a\n-b\n+c\n")
    assert kinds(shown["unified"]) == ["hunk", "add", "del", "add"]
    split = shown["split"][1:]
    assert split[0]["left"] is None and split[0]["right"]["parts"] == [["a", False]]
    assert split[1]["left"]["parts"] == [["b", False]]
    assert split[1]["right"]["parts"] == [["c", False]]


def test_headers_notes_and_the_cut() -> None:
    text = "--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n\\ No newline at end of file\n"
    shown = diffview.text_view(text)
    assert kinds(shown["unified"]) == ["hunk", "del", "add", "note"]
    assert shown["unified"][-1]["text"] == "No newline at end of file"
    assert kinds(shown["split"]) == ["hunk", "line", "note"]
    many = "@@ -1,100 +1,100 @@\n" + "".join(f"+line {i}\n" for i in range(100))
    cut = diffview.text_view(many, max_lines=11)
    assert cut["cut"] == 90 and cut["added"] == 10 and len(cut["unified"]) == 11
    assert diffview.text_view("") == {"unified": [], "split": [], "added": 0, "removed": 0,
                                      "cut": 0}  # fmt: skip


def test_markup_stays_text() -> None:
    text = git_diff("a\n", "<script>alert(1)</script>\n")
    added = [r for r in diffview.text_view(text)["unified"] if r["kind"] == "add"]
    assert "".join(p[0] for p in added[0]["parts"]) == "<script>alert(1)</script>"


def test_long_lines_are_not_compared_word_by_word() -> None:
    old, new = "a " * 1500, "b " + "a " * 1499
    assert diffview.word_marks(old, new) == ([[old, False]], [[new, False]])


def test_field_diffs() -> None:
    shown = diffview.view({"json": {"price": {"previous": 10, "current": 12},
                                    "tags": {"previous": ["a"], "current": None},
                                    "odd": 3}})  # fmt: skip
    assert shown["fields"] == [
        {"field": "price", "previous": "10", "current": "12"},
        {"field": "tags", "previous": '["a"]', "current": "null"},
    ]
    assert shown["unified"] == []
    assert diffview.view({"text": "@@ -1 +1 @@\n-a\n+b\n", "json": {"files": []}})["fields"] == []
    assert diffview.view(None)["unified"] == []
    big = diffview.field_rows({"f": {"previous": "x" * 20_000, "current": ""}})
    assert len(big[0]["previous"]) == diffview.MAX_FIELD + 1
