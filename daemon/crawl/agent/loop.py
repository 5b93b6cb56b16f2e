# The agent loop's decisions as plain values: what one run may spend and what it does next. The
# run (run.py) reads its state from the store before every step and asks `next_step`; so a run
# restarted after a crash decides from exactly what had committed, and nothing here waits for
# the model to declare itself done: the loop ends when nothing is left to read, when the model
# chooses nothing more, at the step cap, or when the budget would not cover another step and the
# answer. One step is kept for the answer, and the answer's estimated cost is reserved before
# every read, so a run that has read anything always gets to answer.
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Action = Literal["kickoff", "read", "choose", "answer", "fail"]
Reason = Literal["", "exhausted", "chose_nothing", "steps", "budget"]
"""Why reading stopped: nothing left to read, the model chose nothing more, the step cap, the
budget (maxCredits)."""

EFFORT_SHARE = {"low": (1, 3), "medium": (2, 3), "high": (1, 1)}
"""A request's `effort` as the share of `[agent] max_steps` it may use (none: all of it)."""
MIN_STEPS = 3
"""A search, one page and the answer."""


@dataclass(frozen=True)
class Spend:
    """What a run used: pages read (each read tried costs one), web searches, model tokens."""

    pages: int = 0
    searches: int = 0
    tokens: int = 0

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            self.pages + other.pages, self.searches + other.searches, self.tokens + other.tokens
        )


def credits(spend: Spend, tokens_per_credit: int) -> int:
    """Credits of `spend`: one per page read and per search, one per started
    `tokens_per_credit` model tokens."""
    return spend.pages + spend.searches + -(-spend.tokens // tokens_per_credit)


def step_cap(max_steps: int, effort: str | None) -> int:
    """The steps a run may take for its `effort` (at least MIN_STEPS)."""
    num, den = EFFORT_SHARE.get(effort or "high", (1, 1))
    return max(MIN_STEPS, max_steps * num // den)


@dataclass(frozen=True)
class Limits:
    """A run's bounds and its cost estimates, in tokens (chars / 4, as the LLM service counts
    before sending)."""

    max_steps: int
    max_credits: int
    tokens_per_credit: int
    per_step: int
    """Most pages chosen at once."""
    choice_tokens: int
    """One choice call: its prompt with the candidates shown, and its answer."""
    answer_base: int
    """The answer call without pages: instructions, schema, the model's answer."""
    page_tokens: int
    """What one page read adds to the answer call."""
    answer_cap: int
    """Most page tokens the answer call takes (the model's input limit)."""

    def answer_tokens(self, pages: int) -> int:
        return self.answer_base + min(pages * self.page_tokens, self.answer_cap)


@dataclass(frozen=True)
class LoopState:
    """What the store holds of a run."""

    kicked_off: bool
    steps: int
    """Steps recorded so far."""
    chosen: int
    """Pages to read (the request's URLs, the model's choices) not read yet."""
    candidates: int
    """Unread links and search results the model may choose from."""
    read: int
    """Pages read with text."""
    last_choice_empty: bool
    """The last step was a choice of nothing."""
    spend: Spend


@dataclass(frozen=True)
class Next:
    action: Action
    count: int = 0
    """Pages to read (read), most pages to choose (choose)."""
    reason: Reason = ""
    """Why reading stopped (answer, fail)."""


def affordable(state: LoopState, limits: Limits, pages: int, extra_tokens: int = 0) -> bool:
    """Whether reading `pages` more (after `extra_tokens` of another call) still leaves the
    answer covered within maxCredits."""
    spend = state.spend + Spend(
        pages=pages, tokens=extra_tokens + limits.answer_tokens(state.read + pages)
    )
    return credits(spend, limits.tokens_per_credit) <= limits.max_credits


def _most_pages(state: LoopState, limits: Limits, wanted: int, extra_tokens: int = 0) -> int:
    n = 0
    while n < wanted and affordable(state, limits, n + 1, extra_tokens):
        n += 1
    return n


def next_step(state: LoopState, limits: Limits) -> Next:
    """The run's next step."""
    if not state.kicked_off:
        return Next("kickoff")
    left = limits.max_steps - state.steps - 1  # the answer's step is kept
    if state.chosen:
        n = _most_pages(state, limits, min(state.chosen, left))
        if n:
            return Next("read", n)
        return _stop(state, "steps" if left <= 0 else "budget")
    if state.last_choice_empty:
        return _stop(state, "chose_nothing")
    if not state.candidates:
        return _stop(state, "exhausted")
    if left < 2:
        return _stop(state, "steps")
    n = _most_pages(state, limits, min(limits.per_step, left - 1), limits.choice_tokens)
    if n:
        return Next("choose", n)
    return _stop(state, "budget")


def _stop(state: LoopState, reason: Reason) -> Next:
    return Next("answer" if state.read else "fail", reason=reason)


def stop_note(reason: Reason, *, read: int, max_credits: int, max_steps: int) -> str | None:
    """What a completed run's `message` says about an early stop (None: it ended by itself)."""
    pages = f"{read} page{'s' if read != 1 else ''}"
    if reason == "budget":
        return (
            f"Stopped reading after {pages}: maxCredits ({max_credits}) would not cover another"
            " step and the answer; the answer is from what was read."
        )
    if reason == "steps":
        return (
            f"Stopped reading after {pages}: the run reached its step cap ({max_steps}); the"
            " answer is from what was read."
        )
    return None


def failure(
    reason: Reason, *, used: int, max_credits: int, first_error: str | None, searched: bool
) -> str:
    """The error of a run that ends having read no page."""
    if reason == "budget":
        return (
            f"Max credits exceeded: maxCredits ({max_credits}) does not cover reading a page and"
            f" answering; {used} used"
        )
    if first_error is not None:
        return f"No page could be read; {first_error}"
    if reason == "steps":
        return "No page could be read within the run's step cap"
    return "No search results found" if searched else "No page could be read"
