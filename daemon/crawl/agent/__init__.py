"""/v2/agent: durable agent jobs — a bounded loop of search, page reads and model choices that
ends in an answer with its sources."""
