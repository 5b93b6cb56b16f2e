"""crawld: one trio daemon for the collector, the tracker, and jobs with durable webhooks."""

__version__ = "0.1.0"
