"""crawld: one trio daemon for the collector, the tracker, and jobs with durable webhooks."""

import sys

__version__ = "0.1.0"

# httpx imports its command-line client when it can (click, and rich and pygments where they are
# installed): about a fifth of a second of CPU at every start, for a tool crawld never runs.
# A None entry makes that import fail as if the extras were missing, which httpx allows for.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
